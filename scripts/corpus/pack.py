"""Packs recorded snapshots into at most N xz-compressed tar files of at most LIMIT MiB each.

    python3 scripts/corpus/pack.py DEST_DIR PREFIX N LIMIT_MIB FILE...

The device tool brings back at most 8 files of 16 MiB: each FILE is compressed on its own
(all cores at once), then the smallest go first into PREFIX-1.tar, PREFIX-2.tar, ... so that
as many recordings as possible come back; what does not fit is named in PREFIX-left.txt.
"""
import lzma
import multiprocessing as mp
import os
import sys
import tarfile


def comp(path):
    with open(path, "rb") as f:
        data = lzma.compress(f.read(), preset=6)
    out = path + ".xz"
    with open(out, "wb") as f:
        f.write(data)
    return out, len(data)


def main():
    dest, prefix, n, limit = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    files = [f for f in sys.argv[5:] if os.path.isfile(f)]
    with mp.Pool(os.cpu_count()) as p:
        done = sorted(p.map(comp, files), key=lambda x: x[1])
    cap = int(limit * 2**20) - 64 * 1024
    bins = [[0, []] for _ in range(n)]
    left = []
    for path, size in done:
        b = next((b for b in bins if b[0] + size + 1024 <= cap), None)
        if b is None:
            left.append(path)
            continue
        b[0] += size + 1024
        b[1].append(path)
    for i, (_, paths) in enumerate(bins):
        if not paths:
            continue
        with tarfile.open(os.path.join(dest, f"{prefix}-{i + 1}.tar"), "w") as t:
            for path in paths:
                t.add(path, arcname=os.path.basename(path))
    with open(os.path.join(dest, f"{prefix}-left.txt"), "w") as f:
        f.write("\n".join(os.path.basename(x) for x in left) + "\n")
    print(f"packed {len(done) - len(left)} of {len(done)} files; left out {len(left)}")


if __name__ == "__main__":
    main()
