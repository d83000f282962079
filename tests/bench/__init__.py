"""Tests of `tandem bench` (a package, so its module names cannot clash with other test folders)."""
