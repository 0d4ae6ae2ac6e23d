"""The ``daskgpu`` command line and its subcommands; nothing imports this package."""
