"""A KV-cache pool that grows block by block, then releases the small blocks, then needs a
large contiguous buffer.

The pool interleaves 768 MiB and 256 MiB blocks until the device is full, frees all the
256 MiB ones (tens of GiB free again), and then asks for 1 GiB: no single hole is large enough,
so the request fails although far more memory than that is free.
"""

from runtime_emu import AclError, acl

MiB = 1 << 20


def main() -> None:
    acl.init(seed=0)
    acl.rt.set_device(0)
    big, small = [], []
    try:
        while True:
            big.append(acl.rt.malloc(768 * MiB, acl.ACL_MEM_MALLOC_HUGE_FIRST))
            small.append(acl.rt.malloc(256 * MiB, acl.ACL_MEM_MALLOC_HUGE_FIRST))
    except AclError:
        pass  # device full: the pool is as big as it gets
    with acl.prof.step():
        for ptr in small:
            acl.rt.free(ptr)
        try:
            workspace = acl.rt.malloc(1024 * MiB, acl.ACL_MEM_MALLOC_HUGE_FIRST)
        except AclError as exc:
            print(f"workspace allocation failed: {exc}")
            workspace = None
    if workspace is not None:
        acl.rt.free(workspace)
    for ptr in big:
        acl.rt.free(ptr)
    acl.finalize()


if __name__ == "__main__":
    main()
