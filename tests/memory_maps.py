"""What the kernel says about this process's memory mappings (Linux's /proc/self/smaps)."""

from __future__ import annotations


def vm_flags(address: int) -> list[str]:
    """The VmFlags of this process's mapping that holds ``address`` ("hg": asked onto huge pages)."""
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                start, end = (int(part, 16) for part in head.split("-"))
                inside = start <= address < end
            elif inside and head == "VmFlags:":
                return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


def middle(tensor) -> int:
    """The address of the middle byte of a CPU tensor's data."""
    return tensor.data_ptr() + tensor.numel() * tensor.element_size() // 2
