import os

import pytest

from distrec.hotline.placement import ThreadPlacement, device_interrupts, interrupt_cpus, parse_cpu_list

ALLOWED = frozenset(os.sched_getaffinity(0))


def test_cpu_lists_parse_ranges_and_spaces():
    assert parse_cpu_list("0-2,5\n") == {0, 1, 2, 5}
    assert parse_cpu_list("0, 1") == {0, 1}
    assert parse_cpu_list("") == frozenset()


def fake_machine(tmp_path, disk_of, irq_cpus: dict[int, str], partition: bool = False):
    """A sysfs and procfs where the block device of ``disk_of`` is a virtio disk on a PCI
    function with MSI interrupts ``irq_cpus`` (irq -> its effective CPU list)."""
    sys_root, proc_root = tmp_path / "sys", tmp_path / "proc"
    pci = sys_root / "devices" / "pci0000:00" / "0000:00:02.0"
    disk = pci / "virtio1" / "block" / "vda"
    (disk / "vda1").mkdir(parents=True)
    (disk / "device").symlink_to(pci / "virtio1")
    (disk / "vda1" / "partition").write_text("1\n")
    (pci / "msi_irqs").mkdir()
    for irq, cpus in irq_cpus.items():
        (pci / "msi_irqs" / str(irq)).write_text("msix\n")
        (proc_root / "irq" / str(irq)).mkdir(parents=True)
        (proc_root / "irq" / str(irq) / "effective_affinity_list").write_text(cpus + "\n")
    dev = os.stat(disk_of).st_dev
    (sys_root / "dev" / "block").mkdir(parents=True)
    (sys_root / "dev" / "block" / f"{os.major(dev)}:{os.minor(dev)}").symlink_to(disk / "vda1" if partition else disk)
    return sys_root, proc_root


@pytest.mark.parametrize("partition", [False, True])
def test_the_disks_interrupts_are_found_through_sysfs(tmp_path, partition):
    sys_root, proc_root = fake_machine(tmp_path, tmp_path, {35: "1", 36: "0-1"}, partition)
    assert device_interrupts(tmp_path, sys_root) == [35, 36]
    assert interrupt_cpus([35, 36], proc_root) == {0, 1}
    assert interrupt_cpus([35], proc_root) == {1}


def test_a_file_system_without_a_block_device_has_no_interrupts(tmp_path):
    assert device_interrupts(tmp_path, tmp_path / "empty-sys") == []
    assert ThreadPlacement.away_from_disk(tmp_path, 1, tmp_path / "empty-sys", tmp_path / "proc") is None


def test_compute_goes_to_the_cpus_without_the_disks_interrupts(tmp_path):
    irq_cpu = max(ALLOWED)
    sys_root, proc_root = fake_machine(tmp_path, tmp_path, {36: str(irq_cpu)})
    placement = ThreadPlacement.away_from_disk(tmp_path, 1, sys_root, proc_root)
    if len(ALLOWED) == 1:
        assert placement is None  # nothing left to compute on
    else:
        assert placement == ThreadPlacement(compute=ALLOWED - {irq_cpu}, prefetch=frozenset({irq_cpu}))
        assert placement.describe() == {"compute_cpus": sorted(ALLOWED - {irq_cpu}), "prefetch_cpus": [irq_cpu]}
    assert ThreadPlacement.away_from_disk(tmp_path, len(ALLOWED), sys_root, proc_root) is None  # too few CPUs left


def test_computing_pins_the_thread_for_the_block_only():
    placement = ThreadPlacement(compute=frozenset({min(ALLOWED)}), prefetch=frozenset({max(ALLOWED)}))
    with placement.computing():
        assert os.sched_getaffinity(0) == {min(ALLOWED)}
    assert os.sched_getaffinity(0) == ALLOWED
