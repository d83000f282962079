"""Tests of `tandem.router` (a package, so its module names cannot clash with other test folders)."""
