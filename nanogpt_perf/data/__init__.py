"""Data: prepared dataset folders, token files, the order windows are read in, the loader, the
preparation of web-scale corpora, tokenizers."""
