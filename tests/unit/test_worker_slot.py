"""What a worker counts as its own in a memory slot it took over from a dead one."""

from __future__ import annotations


def test_what_a_worker_inherits_in_its_slot_is_never_its_own_heap() -> None:
    from renderctl.worker import inherited_part

    mb = 1 << 20
    # What the runner saw at handover, still all there beside the worker's own 10 MB heap
    assert inherited_part(held=55 * mb, handed_over=45 * mb, anon=10 * mb) == 45 * mb
    # The inherited file deleted before the first job (review DS): only what is left that
    # is not the worker's heap, not the worker's own memory taken for the file's
    assert inherited_part(held=13 * mb, handed_over=45 * mb, anon=12 * mb) == 1 * mb
    # A fresh slot, or no anon figure
    assert inherited_part(held=10 * mb, handed_over=0, anon=9 * mb) == 0
    assert inherited_part(held=10 * mb, handed_over=4 * mb, anon=None) == 4 * mb
