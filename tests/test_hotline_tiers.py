import os
import shutil
import sys

import numpy as np
import pytest
import torch

from distrec.allocator import HUGE_PAGE_BYTES
from distrec.errors import DistrecError
from distrec.hotline.row_files import BASE_FILE, CHANGED_FILE, CHANGED_IDS_FILE, SavedRows
from distrec.hotline.tiers import TwoTierStore
from memory_maps import middle, vm_flags

ROWS, WIDTH, DIM = 50, 5, 4  # 4 weights and 1 optimizer-state float per row


def sgd_with_counter(rows: torch.Tensor, grad: torch.Tensor) -> None:
    """A row rule touching weights and state: w -= 0.1 * (summed g), state += 1, per row with entries."""
    grad = grad.coalesce()
    touched = grad.indices()[0]
    rows[touched, :DIM] -= 0.1 * grad.values()
    rows[touched, DIM] += 1


def update(store: TwoTierStore, ids: torch.Tensor, grads: torch.Tensor) -> None:
    """``store.update`` with entries given by global id, split by tier."""
    slots = store.slots(ids)
    hot = slots >= 0
    store.update(slots[hot], grads[hot], ids[~hot], grads[~hot], sgd_with_counter)


def make_store(tmp_path, slow: str) -> tuple[TwoTierStore, torch.Tensor]:
    reference = torch.randn(ROWS, WIDTH, generator=torch.Generator().manual_seed(0))
    store = TwoTierStore(ROWS, WIDTH, torch.device("cpu"), init=lambda s, e: reference[s:e], slow=slow, directory=tmp_path)
    return store, reference.clone()


def apply_reference(reference: torch.Tensor, ids: torch.Tensor, grads: torch.Tensor) -> None:
    """The update on a plain table: unique ``ids``, one gradient row each."""
    reference[ids, :DIM] -= 0.1 * grads
    reference[ids, DIM] += 1


@pytest.mark.parametrize("slow", ["disk", "host"])
def test_tier_moves_lose_no_update(tmp_path, slow):
    store, reference = make_store(tmp_path, slow)
    gen = torch.Generator().manual_seed(1)
    hot_sets = [np.array([1, 4, 9, 20]), np.array([4, 9, 30, 31, 49]), np.array([0, 1]), np.array([], dtype=np.int64)]
    with store:
        for hot in hot_sets:
            store.set_hot(hot)
            assert store.hot_ids.tolist() == hot.tolist()
            for _ in range(2):
                ids = torch.unique(torch.cat([torch.as_tensor(hot), torch.randint(0, ROWS, (10,), generator=gen)]))
                grads = torch.randn(ids.numel(), DIM, generator=gen)
                update(store, ids, grads)
                apply_reference(reference, ids, grads)
            assert torch.equal(store.gather(torch.arange(ROWS)), reference)
        assert store.fast_bytes == 0


def test_each_row_is_updated_in_its_own_tier_only(tmp_path):
    store, reference = make_store(tmp_path, "host")
    with store:
        store.set_hot(np.array([2, 3]))
        stale = store.slow[[2, 3]].clone()
        update(store, torch.tensor([2, 3, 7]), torch.ones(3, DIM))
        assert torch.equal(store.slow[[2, 3]], stale)  # hot rows' slow slots are untouched
        assert store.slow[7, DIM] == reference[7, DIM] + 1
        assert torch.equal(store.fast[:, DIM], reference[[2, 3], DIM] + 1)


def test_repeated_entries_of_a_row_are_summed_in_either_tier(tmp_path):
    store, reference = make_store(tmp_path, "disk")
    with store:
        store.set_hot(np.array([3, 8]))
        ids = torch.tensor([3, 20, 3, 20, 8])
        grads = torch.arange(5.0).unsqueeze(1).repeat(1, DIM)
        update(store, ids, grads)
        apply_reference(reference, torch.tensor([3, 8, 20]), torch.tensor([[2.0], [4.0], [4.0]]).repeat(1, DIM))
        assert torch.allclose(store.gather(torch.arange(ROWS)), reference)


def test_slots_follow_the_hot_set(tmp_path):
    store, _ = make_store(tmp_path, "host")
    with store:
        store.set_hot(np.array([4, 9, 30]))
        assert store.slots(torch.tensor([30, 5, 4, 9])).tolist() == [2, -1, 0, 1]
        store.set_hot(np.array([9, 31]))
        assert store.slots(torch.tensor([4, 9, 30, 31])).tolist() == [-1, 0, -1, 1]


def test_gather_mixes_tiers_and_narrows_to_the_weights(tmp_path):
    store, reference = make_store(tmp_path, "disk")
    with store:
        store.set_hot(np.array([5, 6, 40]))
        ids = torch.tensor([40, 0, 5, 5, 49])
        assert torch.equal(store.gather(ids, width=DIM), reference[ids, :DIM])


def test_disk_tier_leaves_no_file(tmp_path):
    store, _ = make_store(tmp_path, "disk")
    assert store.slow_kind == "disk"
    assert list(tmp_path.iterdir()) == []  # unlinked as soon as it was mapped
    update(store, torch.tensor([1]), torch.ones(1, DIM))
    store.close()
    assert list(tmp_path.iterdir()) == []


def test_disk_tier_too_large_for_the_disk_is_a_user_error(tmp_path):
    with pytest.raises(DistrecError, match="slow tier"):
        TwoTierStore(2**50, 4, torch.device("cpu"), init=lambda s, e: torch.zeros(e - s, 4), slow="disk", directory=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_slow_tier_file_cut_short_in_use_is_named_before_any_access_past_its_end(tmp_path):
    """Each gather, write-back, tier move and save checks the file's size first: without it the
    first access past the new end would kill the process with SIGBUS."""
    path = tmp_path / "rows.f32"
    np.zeros((ROWS, WIDTH), np.float32).tofile(path)
    gen = torch.Generator().manual_seed(0)
    with TwoTierStore(ROWS, WIDTH, torch.device("cpu"), init=None, slow_file=path) as store:
        store.set_hot(np.array([1, 2]))
        os.truncate(path, ROWS * WIDTH * 4 // 2)
        last = torch.tensor([ROWS - 1])
        accesses = {
            "gather": lambda: store.gather(last),
            "write-back": lambda: update(store, last, torch.randn(1, DIM, generator=gen)),
            "tier move": lambda: store.set_hot(np.array([ROWS - 1])),
            "save": lambda: store.save(tmp_path / "checkpoint"),
        }
        (tmp_path / "checkpoint").mkdir()
        for access in accesses.values():
            with pytest.raises(DistrecError, match=f"the slow tier's file '{path}' was truncated to {ROWS * WIDTH * 2} bytes while in use"):
                access()
        os.truncate(path, ROWS * WIDTH * 4)  # its size back: the store works on
        assert store.gather(last).shape == (1, WIDTH)


def test_bad_hot_ids_are_rejected(tmp_path):
    store, _ = make_store(tmp_path, "host")
    with store, pytest.raises(ValueError):
        store.set_hot(np.array([3, 3]))


def test_save_and_load_keep_every_row_of_both_tiers(tmp_path):
    store, reference = make_store(tmp_path / "a", "disk")
    with store:
        store.set_hot(np.array([0, 10, 11]))
        update(store, torch.tensor([0, 5, 11]), torch.ones(3, DIM))
        apply_reference(reference, torch.tensor([0, 5, 11]), torch.ones(3, DIM))
        (tmp_path / "ckpt").mkdir()
        store.save(tmp_path / "ckpt")
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["hotline-rows.npy"]  # the first save: a full copy
    other = TwoTierStore(ROWS, WIDTH, torch.device("cpu"), init=lambda s, e: torch.zeros(e - s, WIDTH), slow="host")
    with other:
        other.set_hot(np.array([5, 10]))
        other.load(tmp_path / "ckpt")
        assert torch.equal(other.gather(torch.arange(ROWS)), reference)
        other.set_hot(np.array([], dtype=np.int64))
        assert torch.equal(other.slow, reference)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="huge pages are Linux's")
def test_the_fast_tier_and_a_ram_slow_tier_are_asked_onto_huge_pages(tmp_path):
    rows = HUGE_PAGE_BYTES // (WIDTH * 4) * 4  # 4 huge pages of rows
    store = TwoTierStore(rows, WIDTH, torch.device("cpu"), init=lambda s, e: torch.zeros(e - s, WIDTH), slow="host")
    with store:
        store.set_hot(np.arange(rows // 2))
        assert "hg" in vm_flags(middle(store.fast)) and "hg" in vm_flags(middle(store.slow))


def saved(directory) -> torch.Tensor:
    """The rows a checkpoint directory holds, base and changed rows together (as ``distrec evaluate`` maps them)."""
    return torch.from_numpy(np.array(SavedRows(directory).mapped()))


def test_a_save_beside_the_last_links_its_base_and_writes_only_the_changed_rows(tmp_path):
    store, reference = make_store(tmp_path / "scratch", "disk")
    run = tmp_path / "run"
    with store:
        store.set_hot(np.array([3, 20]))
        (run / "first").mkdir(parents=True)
        store.save(run / "first")
        ids = torch.tensor([3, 7, 30])  # a hot row and two cold ones
        update(store, ids, torch.ones(3, DIM))
        apply_reference(reference, ids, torch.ones(3, DIM))
        store.set_hot(np.array([20, 41]))  # row 3 leaves the fast tier (written back), 41 enters
        (run / "second").mkdir()
        store.save(run / "second")
        assert torch.equal(saved(run / "second"), reference)
        base = run / "second" / "hotline-rows.npy"
        assert base.samefile(run / "first" / "hotline-rows.npy")  # shared, not copied
        assert np.load(run / "second" / "hotline-rows-changed-ids.npy").tolist() == [3, 7, 20, 30, 41]  # written rows and hot rows
        shutil.rmtree(run / "first")  # the next checkpoint finds the base in "second"
        update(store, torch.tensor([9]), torch.ones(1, DIM))
        apply_reference(reference, torch.tensor([9]), torch.ones(1, DIM))
        (run / "third").mkdir()
        store.save(run / "third")
        assert (run / "third" / "hotline-rows.npy").samefile(base)
        assert torch.equal(saved(run / "third"), reference)
        moved = tmp_path / "elsewhere" / "ckpt"  # no base beside it: a full copy, the new base
        moved.mkdir(parents=True)
        store.save(moved)
        assert not (moved / "hotline-rows-changed-ids.npy").exists() and not (moved / "hotline-rows.npy").samefile(base)
        assert torch.equal(saved(moved), reference)
    other = TwoTierStore(ROWS, WIDTH, torch.device("cpu"), init=lambda s, e: torch.zeros(e - s, WIDTH), slow="host")
    with other:
        other.load(run / "third")  # base and changed rows; its base becomes the store's
        assert torch.equal(other.slow, reference)
        update(other, torch.tensor([11]), torch.ones(1, DIM))
        apply_reference(reference, torch.tensor([11]), torch.ones(1, DIM))
        (run / "fourth").mkdir()
        other.save(run / "fourth")
        assert (run / "fourth" / "hotline-rows.npy").samefile(base)
        assert np.load(run / "fourth" / "hotline-rows-changed-ids.npy").tolist() == [3, 7, 9, 11, 20, 30, 41]
        assert torch.equal(saved(run / "fourth"), reference)


def test_a_save_after_more_than_half_the_rows_changed_writes_a_new_base(tmp_path):
    store, reference = make_store(tmp_path / "scratch", "host")
    with store:
        (tmp_path / "a").mkdir()
        store.save(tmp_path / "a")
        ids = torch.arange(0, ROWS, 2)
        update(store, ids, torch.ones(len(ids), DIM))  # exactly half: still the changed rows only
        apply_reference(reference, ids, torch.ones(len(ids), DIM))
        (tmp_path / "b").mkdir()
        store.save(tmp_path / "b")
        assert (tmp_path / "b" / "hotline-rows.npy").samefile(tmp_path / "a" / "hotline-rows.npy")
        update(store, torch.tensor([1]), torch.ones(1, DIM))
        apply_reference(reference, torch.tensor([1]), torch.ones(1, DIM))
        (tmp_path / "c").mkdir()
        store.save(tmp_path / "c")
        assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["hotline-rows.npy"]
        assert not (tmp_path / "c" / "hotline-rows.npy").samefile(tmp_path / "a" / "hotline-rows.npy")
        assert torch.equal(saved(tmp_path / "c"), reference)


def test_load_rejects_rows_of_another_shape(tmp_path):
    np.save(tmp_path / "hotline-rows.npy", np.zeros((ROWS, WIDTH + 1), dtype=np.float32))
    store, _ = make_store(tmp_path, "host")
    with store, pytest.raises(DistrecError, match="expected"):
        store.load(tmp_path)


def test_rows_are_initialised_on_first_use_and_never_when_a_load_comes_first(tmp_path):
    calls = []

    def init(start: int, end: int) -> torch.Tensor:
        calls.append((start, end))
        return torch.full((end - start, WIDTH), 2.0)

    with TwoTierStore(ROWS, WIDTH, torch.device("cpu"), init=init, slow="disk", directory=tmp_path / "a") as store:
        assert calls == []
        assert torch.equal(store.gather(torch.tensor([4])), torch.full((1, WIDTH), 2.0))
        store.gather(torch.tensor([5]))
        assert calls == [(0, ROWS)]
        (tmp_path / "ckpt").mkdir()
        store.save(tmp_path / "ckpt")
    calls.clear()
    with TwoTierStore(ROWS, WIDTH, torch.device("cpu"), init=init, slow="disk", directory=tmp_path / "b") as resumed:
        resumed.load(tmp_path / "ckpt")  # a resumed run: every row comes from the checkpoint
        assert torch.equal(resumed.slow, torch.full((ROWS, WIDTH), 2.0))
    assert calls == []


def test_saved_rows_of_twice_the_ram_map_with_their_changed_rows_over_them(tmp_path):
    rows = 2 * os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 64  # rows of 16 floats
    with open(tmp_path / BASE_FILE, "wb") as f:  # sparse: reads as zeros, takes no disk
        np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": (rows, 16)})
        f.truncate(f.tell() + rows * 64)
    ids = np.array([0, 12_345, rows - 1])
    np.save(tmp_path / CHANGED_IDS_FILE, ids)
    np.save(tmp_path / CHANGED_FILE, np.arange(1, 4, dtype=np.float32)[:, None].repeat(16, 1))
    mapped = SavedRows(tmp_path).mapped(8)  # a map that reserved its size of memory was refused here
    assert mapped.shape == (rows, 8)
    assert mapped[ids].tolist() == [[1.0] * 8, [2.0] * 8, [3.0] * 8] and not mapped[1:12_345].any()
    assert np.all(np.load(tmp_path / BASE_FILE, mmap_mode="r")[ids] == 0)  # the file is not written
