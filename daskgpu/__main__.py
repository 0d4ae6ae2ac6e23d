"""``python -m daskgpu``: the ``daskgpu`` command line."""

if __name__ == "__main__":  # not when a spawned worker process imports this module
    from daskgpu._cli.main import main

    raise SystemExit(main())
