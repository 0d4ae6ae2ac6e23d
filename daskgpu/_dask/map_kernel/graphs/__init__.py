"""``map_kernel``'s tasks on Dask's two array graph layers, behind one interface.

==========  =================================================================
module      what it holds
==========  =================================================================
``layer``   :class:`~.layer.GraphLayer`, the Protocol both layers implement
            (checked by mypy), with what they share: a result picked out of
            each launch, per-chunk outputs combined
``hlg``     :class:`~.hlg.HLGLayer`: on the HighLevelGraph
            (``array.query-planning`` off), with a ``da.from_array`` input
            read in the groups' pieces
``expr``    :class:`~.expr.ExprLayer`: on array expressions, a ``MapKernel``
            expression Dask's optimizer sees through
==========  =================================================================

:func:`daskgpu._dask.map_kernel.api.graph_layer` picks the one ``dask.array``
runs on; a third layer is a third module implementing
:class:`~.layer.GraphLayer`, picked there.
"""
