"""An English→German parallel corpus from Debian's own human translations.

Sources (one module each; ``build`` runs them, splits and writes the files):

- ``ddtp``: Debian package descriptions and their German DDTP translations
  (``Translation-en`` / ``Translation-de`` of bookworm main, joined on
  ``Description-md5``, paragraph by paragraph);
- ``catalogs``: gettext catalogs (``.mo``) of the German locale in named packages
  (LibreOffice UI, GCC, GIMP, Gramps, VLC, Evolution, GnuCash, aptitude, glibc, ...),
  ``msgid`` → ``msgstr``;
- ``lohelp``: LibreOffice help (``libreoffice-help-en-us`` / ``-de``): same HTML file,
  same paragraph ``id``;
- ``mozilla``: Firefox ESR / Thunderbird language packs (``-de`` against ``-en-gb``):
  same file, same message id in ``.ftl`` and ``.properties``;
- ``docs``: Debian documentation (Debian Reference, Developer's Reference, New
  Maintainers' Guide, Debian FAQ, the Debian Administrator's Handbook, the installation
  guide, GNOME help): English and German HTML / Mallard pages of the same chapter,
  block by block;
- ``manpages``: ``manpages-de``'s German manual pages against the English pages of the
  packages that own them (man-pages, coreutils, util-linux, ...), roff block by block;
- ``ding``: the existing Ding dictionary splits (``pipelines.data.ding``), kept as they are.

Terms: a *pair* is ``(english, german)``; its *group* is the unit a split never cuts
(one package description, one ``.mo`` file, one help file, one language-pack file,
one documentation chapter, one manual page). ``sources`` names the packages of each source.
``python -m pipelines.data.debian.build`` (``specdec prepare --corpus debian``) writes
``assets/data/debian/<source>/{train,validation,test}.tsv.xz``, ``counts.json`` and
``LICENSE.md`` per source.
"""
