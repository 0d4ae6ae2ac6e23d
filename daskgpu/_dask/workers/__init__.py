"""The worker side of the Dask layer: what a GPU worker is, and what runs on it.

=======================  ==========================================================
module                   what it holds
=======================  ==========================================================
``gpu_worker``           one definition of a GPU worker, however it is started
``plugin``               ``GPUWorkerPlugin``: a worker's GPU set up, watched, reported
``gpu_time``             launches' time by activity into distributed's fine metrics
``prometheus``           daskgpu's figures at a worker's Prometheus endpoint
``device_facts``         the device's facts: read at setup, sent, offered as memory
``watchdog``             time limits, cancelled and lost launches: the launch guard
``launch_watch``         the running launches' limits, and the guard's decisions
=======================  ==========================================================
"""
