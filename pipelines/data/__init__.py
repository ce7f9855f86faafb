"""Corpora the project prepares itself (the Ding En–De dictionary)."""
