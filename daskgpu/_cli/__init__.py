"""The ``daskgpu`` command line and its subcommands; nothing imports this package.

===================  ==============================================================
module               what it holds
===================  ==============================================================
``main``             the parser of every subcommand, and the dispatch to them
``common``           what the commands share: the usage error, parser, argument
                     types, the module and kernel a command names
``info``             ``daskgpu info``: the driver, nvJitLink and the GPUs
``workers``          ``daskgpu worker``: one Nanny per local GPU
``bundle_commands``  ``daskgpu compile`` and ``daskgpu inspect``
``batch``            ``daskgpu batch``: its parser, kernel and exit status
``demo``             ``daskgpu demo``: saxpy on the embedded local GPU cluster
``bench/``           ``daskgpu bench``: one module per group of comparisons
===================  ==============================================================
"""
