"""Host staging's pure parts, without a GPU: the out-of-memory message, one pool per process."""


def test_out_of_memory_message_names_sizes_and_the_fix():
    from daskgpu._runtime.gpu.host_staging import out_of_memory_message

    gib = 1 << 30
    msg = out_of_memory_message(200 * gib, 3 * gib, 12 * gib, 140 * gib)
    assert "a host array of 200.00 GiB does not fit on the GPU" in msg
    assert "12.00 GiB of 140.00 GiB are free" in msg
    assert "3.00 GiB of this launch's arrays already there" in msg
    assert "Nothing was launched and the arrays are unchanged" in msg
    assert "rechunk" in msg
    assert "already there" not in out_of_memory_message(gib, 0, 0, gib)


def test_threads_asking_first_at_once_share_one_copy_pipeline_and_output_pool():
    # Each owns page-locked memory under a bound: a second one would exceed it.
    import threading

    from daskgpu._runtime.gpu.host_staging import one_per_process

    made = []
    start = threading.Barrier(8)

    @one_per_process
    def pool():
        made.append(object())
        threading.Event().wait(0.05)  # a slow make: the others arrive meanwhile
        return made[-1]

    got = []

    def ask():
        start.wait()
        got.append(pool())

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1 and all(g is made[0] for g in got)
