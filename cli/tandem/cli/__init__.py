"""The `tandem` command line: one click group, one module per subcommand."""
