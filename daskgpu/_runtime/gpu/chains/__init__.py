"""Launches fused into one task, on the device: their arrays, and their CUDA graphs.

=================  ==============================================================
module             what it holds
=================  ==============================================================
``device_chain``   a fused task's inputs and intermediates on the device
``graphs``         a fused chain captured once as a CUDA graph, replayed per chunk
=================  ==============================================================
"""
