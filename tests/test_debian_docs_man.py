"""The Debian corpus's documentation and manual-page aligners, on real excerpts.

tests/data/debian holds whole pages from bookworm packages: chapter 10 of the Debian
FAQ (``debian-faq`` / ``debian-faq-de``), one GNOME help page (``gnome-user-docs``, C and
de) and ``chdir(2)`` (``manpages-dev`` / ``manpages-de-dev``).
"""

from __future__ import annotations

import gzip
import pathlib

import pytest

from pipelines.data.debian import build, docs, manpages
from pipelines.data.debian.common import Pair

DATA = pathlib.Path(__file__).parent / "data" / "debian"


def _faq(language: str) -> str:
    return (DATA / f"docs_faq_kernel.{language}.html").read_text()


def test_docs_pairs_a_faq_chapter_block_by_block():
    pairs, counts = docs.align_documents(_faq("en"), _faq("de"), "docs:debian-faq/kernel")
    assert counts == {"unaligned_blocks": 0, "implausible": 0}
    as_tuples = [(" ".join(p.english.split()), " ".join(p.german.split())) for p in pairs]
    assert ("Yes.", "Ja.") in as_tuples
    # the header and footer navigation (this chapter's and its neighbours' titles) is out
    assert not any(en.startswith("Chapter 11.") for en, _ in as_tuples)
    assert [en for en, _ in as_tuples].count("Chapter 10. Debian and the kernel") == 2  # title, h1
    assert (
        "(replace NNN with your kernel version and revision number, of course)",
        "(Natürlich müssen Sie NNN durch die Kernelversion und Revisionsnummer des "
        "entsprechenden Kernels ersetzen.)",
    ) in as_tuples
    # the two listings (<pre>) keep the blocks in step but are not pairs
    assert not any("dpkg --purge" == en.strip() for en, _ in as_tuples)
    assert len(pairs) == 23 and {p.group for p in pairs} == {"docs:debian-faq/kernel"}


def test_docs_pairs_only_the_sections_that_still_match():
    english, german = docs.blocks(_faq("en")), docs.blocks(_faq("de"))
    assert [tag for tag, _ in english] == [tag for tag, _ in german]
    # the German section 10.4 loses a paragraph: that section is not paired, the rest is
    lost = next(i for i, (_, text) in enumerate(german) if text.strip().startswith("(Natürlich"))
    pairs, unaligned = docs.aligned_blocks(english, german[:lost] + german[lost + 1 :])
    assert unaligned == 3  # 10.4's heading and its two paragraphs
    assert len(pairs) == 23 - 3
    assert all(not en.strip().startswith("(replace NNN") for en, _ in pairs)
    # a page whose sections do not even match in number pairs nothing
    heading = next(i for i, (tag, _) in enumerate(german) if tag == "h2")
    pairs, unaligned = docs.aligned_blocks(english, german[:heading] + german[heading + 1 :])
    assert pairs == [] and unaligned == 23


def test_docs_drops_mallard_editor_comments():
    english = (DATA / "docs_hardware-auth.C.page").read_text()
    german = (DATA / "docs_hardware-auth.de.page").read_text()
    assert "Change the desc" in english  # a <comment>, which translations leave out
    pairs, counts = docs.align_documents(english, german, "docs:gnome-help/hardware-auth")
    assert [(p.english, p.german) for p in pairs] == [
        (
            "Use hardware devices to authenticate instead of passwords.",
            "Verwenden Sie zur Legitimierung Hardware-Geräte anstelle von Passwörtern.",
        ),
        ("Fingerprints & smart cards", "Fingerabdruckleser und Smartcards"),
    ]
    assert counts == {"unaligned_blocks": 0, "implausible": 0}


def test_docs_rejects_pairs_of_very_different_length():
    assert docs.plausible("Yes.", "Ja.")
    assert docs.plausible("A short paragraph of text.", "Ein kurzer Absatz mit etwas Text.")
    assert not docs.plausible("Short title", "Ein ganz anderer Absatz " * 5)
    english = "<p>Installing Debian</p><p>Read this first.</p>"
    german = "<p>Debian installieren</p><p>" + "Lesen Sie dies zuerst, bevor Sie. " * 6 + "</p>"
    pairs, counts = docs.align_documents(english, german, "g")
    assert [p.english for p in pairs] == ["Installing Debian"]
    assert counts == {"unaligned_blocks": 0, "implausible": 1}


def test_docs_extract_maps_chapter_files_and_counts_missing_ones(tmp_path):
    manual = next(m for m in docs.MANUALS if m.name == "debian-faq")
    english_root, german_root = tmp_path / "en", tmp_path / "de"
    (english_root / manual.english_dir).mkdir(parents=True)
    (german_root / manual.german_dir).mkdir(parents=True)
    (english_root / manual.english_dir / "kernel.en.html").write_text(_faq("en"))
    (german_root / manual.german_dir / "kernel.de.html").write_text(_faq("de"))
    (english_root / manual.english_dir / "software.en.html").write_text(_faq("en"))
    (english_root / manual.english_dir / "kernel.html").write_text(_faq("en"))  # not *.en.html
    pairs, counts = docs.extract(manual, english_root, german_root)
    assert counts["chapters"] == 1 and counts["missing_german"] == 1
    assert len(pairs) == 23 and pairs[0].group == "docs:debian-faq/kernel"


def test_man_render_resolves_escapes_and_font_changes():
    assert manpages.render(r"\fBchdir\fP() \- change working directory") == (
        "chdir() - change working directory"
    )
    assert manpages.render(r"\(lqfoo\(rq \(em \fIpath\fR\e\(Fobar\(Fc") == "“foo” — path\\«bar»"
    page = '.TH X 1\n.SH "SEE ALSO"\n.BR chdir (2),\n.IR "two words" .\n'
    assert manpages.blocks(page) == [("SH", "SEE ALSO"), ("SH-body", "chdir(2), two words.")]
    # macro definitions and ignored blocks are not text, up to ".." or an indented ".  ."
    page = (
        ".TH X 1\n.de URL\n\\fI\\\\$2\\fP <\\\\$1>\n.nf\n..\n.if \\n[.g] \\{\\\n"
        ".  am URL\n.    ad l\n.  .\n.\\}\n.ig\nhidden text\n..\n.SH NAME\nx \\- does y\n"
    )
    assert manpages.blocks(page) == [("SH", "NAME"), ("SH-body", "x - does y")]


def test_man_pairs_chdir_without_synopsis_or_translator_credits():
    english = (DATA / "man_chdir.2.en").read_text()
    german = (DATA / "man_chdir.2.de").read_text()
    pairs, counts = manpages.align_pages(english, german, "man:man2/chdir.2")
    assert counts == {"unaligned_blocks": 0, "implausible": 0}
    as_tuples = [(p.english, p.german) for p in pairs]
    assert ("RETURN VALUE", "RÜCKGABEWERT") in as_tuples
    assert (
        "chdir, fchdir - change working directory",
        "chdir, fchdir - aktuelles Arbeitsverzeichnis wechseln",
    ) in as_tuples
    assert ("fd is not a valid file descriptor.", "dd ist kein zulässiger Dateideskriptor.") in (
        as_tuples
    )
    assert ("EACCES", "EACCES") in as_tuples  # a .TP term; the build drops EN == DE later
    assert not any("int chdir(" in en for en, _ in as_tuples)  # synopsis: .nf, no unit
    assert not any("Kobras" in de or "HAFTUNG" in de for _, de in as_tuples)  # credits
    assert len(pairs) == 44
    kept, dropped = build.clean_pairs(pairs, accelerators=False)
    assert ("EACCES", "EACCES") not in [(p.english, p.german) for p in kept]
    assert dropped["same_text"] >= 10


def test_man_extract_skips_links_and_pages_without_english(tmp_path):
    english_root, german_root = tmp_path / "manpages-dev", tmp_path / "manpages-de-dev"
    en_dir = english_root / manpages.MAN_DIR / "man2"
    de_dir = german_root / manpages.MAN_DIR / "de" / "man2"
    en_dir.mkdir(parents=True)
    de_dir.mkdir(parents=True)
    for directory, name in ((en_dir, "en"), (de_dir, "de")):
        page = (DATA / f"man_chdir.2.{name}").read_bytes()
        (directory / "chdir.2.gz").write_bytes(gzip.compress(page))
        (directory / "fchdir.2.gz").symlink_to("chdir.2.gz")  # a link: skipped
    (en_dir / "getcwd.2").write_text(".so man3/getcwd.3\n")  # a .so page: skipped
    (de_dir / "getcwd.2").write_text((DATA / "man_chdir.2.de").read_text())
    (de_dir / "only_german.2").write_text((DATA / "man_chdir.2.de").read_text())
    pairs, counts = manpages.extract([german_root], [english_root])
    assert counts["pages"] == 1 and counts["links"] == 2 and counts["no_english"] == 1
    assert len(pairs) == 44 and all(p.group == "man:man2/chdir.2" for p in pairs)
    assert isinstance(pairs[0], Pair)


def test_docs_leaves_page_navigation_out():
    # the Administrator's Handbook's navigation list (apt.html, en-US and de-DE), nested
    # lists inside it included, around one paragraph
    navigation = (
        '<ul class="docnav top"><li class="previous"><a accesskey="p" href="a.html">'
        "<strong>{prev}</strong>5.5. {title}</a></li><li><ul><li>x</li></ul></li></ul>"
    )
    english = navigation.format(prev="Prev", title="Coexistence") + "<p>APT is a tool.</p>"
    german = navigation.format(prev="Zurück", title="Koexistenz") + "<p>APT ist ein Werkzeug.</p>"
    pairs, _ = docs.align_documents(english, german, "g")
    assert [(p.english, p.german) for p in pairs] == [("APT is a tool.", "APT ist ein Werkzeug.")]


def test_a_partial_build_may_not_replace_the_committed_corpus(tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        build.main(["--sources", "manpages", "--cache", str(tmp_path / "cache")])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "--sources manpages builds a corpus of those sources only" in err
    assert "Give --output" in err
    assert not (tmp_path / "cache").exists()  # refused before fetching anything
