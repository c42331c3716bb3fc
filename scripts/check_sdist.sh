#!/usr/bin/env bash
# Checks that the sdist builds what the wheel ships: the CLI binary, libvramroom_torch.so, the
# extension and the Python package (issue 29: "an sdist that builds").
#
# Usage: scripts/check_sdist.sh SDIST [--full]
#   default (seconds; scripts/build_wheel.sh runs it on every sdist it writes): the sdist's
#     build backend is the in-tree one (build_backend/vramroom_build.py), which builds the
#     CLI and the allocator library before maturin; its workspace resolves with the sdist's
#     own Cargo.lock, offline, and holds the `vramroom` binary and the vramroom-torch cdylib;
#     and the backend reads cargo's artifact messages right.
#   --full (a whole release build from scratch, about 6 minutes on two cores): `pip install`
#     of the sdist into a fresh venv (maturin from PyPI), then the CLI, the API, the
#     allocator library and the pytest plugin of that install are checked.
set -euo pipefail
SDIST=${1:?usage: scripts/check_sdist.sh SDIST [--full]}
SDIST=$(cd "$(dirname "$SDIST")" && pwd)/$(basename "$SDIST")
FULL=0
[ "${2:-}" = "--full" ] && FULL=1
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail() {
    echo "check_sdist.sh: $SDIST: $*" >&2
    exit 1
}

tar xzf "$SDIST" -C "$TMP"
SRC=$(echo "$TMP"/vramroom-*)
[ -d "$SRC" ] || fail "no vramroom-*/ inside"
grep -qx 'build-backend = "vramroom_build"' "$SRC/pyproject.toml" ||
    fail "pyproject.toml's build-backend is not vramroom_build (maturin alone builds only the extension)"
grep -qx 'backend-path = \["build_backend"\]' "$SRC/pyproject.toml" ||
    fail "pyproject.toml has no backend-path = [\"build_backend\"]"
[ -f "$SRC/build_backend/vramroom_build.py" ] || fail "build_backend/vramroom_build.py is missing"

# The workspace as cargo resolves it from the sdist alone: --locked fails if a crate it needs
# is missing (the lock would change), --offline keeps it to the registry cache the test
# build just filled.
META=$(cargo metadata --format-version 1 --locked --offline --manifest-path "$SRC/Cargo.toml") ||
    fail "its workspace does not resolve"
echo "$META" | python3 -c '
import json, sys
m = json.load(sys.stdin)
members = set(m["workspace_members"])
kinds = {(p["name"], t["name"]): t["kind"] for p in m["packages"] if p["id"] in members
         for t in p["targets"]}
need = {("vramroom", "vramroom"): "bin", ("vramroom-torch", "vramroom_torch"): "cdylib",
        ("vramroom-py", "vramroom_native"): "cdylib"}
missing = ["%s (%s of %s)" % (t, k, p) for (p, t), k in need.items() if k not in kinds.get((p, t), [])]
if missing:
    sys.exit("the workspace lacks " + ", ".join(missing))
' || fail "see above"

# The backend's reading of cargo's messages, without maturin (a stand-in module): the paths
# come from cargo's compiler-artifact lines, whatever the target dir.
mkdir -p "$TMP/stub/maturin"
cat >"$TMP/stub/maturin/__init__.py" <<'EOF'
build_wheel = build_editable = build_sdist = None
get_requires_for_build_wheel = get_requires_for_build_editable = None
get_requires_for_build_sdist = prepare_metadata_for_build_wheel = None
prepare_metadata_for_build_editable = None
EOF
PYTHONPATH="$TMP/stub:$SRC/build_backend" python3 -c '
import json
import vramroom_build as b

def art(name, kind, files, exe=None):
    return json.dumps({"reason": "compiler-artifact", "target": {"name": name, "kind": kind},
                       "filenames": files, "executable": exe})

lines = ["Compiling x", art("vramroom", ["lib"], ["/t/libvramroom.rlib"]),
         art("vramroom_torch", ["cdylib", "rlib"], ["/t/libvramroom_torch.so", "/t/libvramroom_torch.rlib"]),
         art("vramroom", ["bin"], ["/t/vramroom"], "/t/vramroom"),
         json.dumps({"reason": "build-finished", "success": True})]
assert b.native_artifacts(lines) == ("/t/vramroom", "/t/libvramroom_torch.so"), b.native_artifacts(lines)
try:
    b.native_artifacts(lines[:2])
except b.BuildError as e:
    assert "vramroom binary" in str(e) and "libvramroom_torch.so" in str(e), e
else:
    raise AssertionError("no error without artifacts")
' || fail "the build backend misreads cargo's messages"

if [ "$FULL" = 1 ]; then
    python3 -m venv "$TMP/venv"
    "$TMP/venv/bin/python" -m pip install -q "$SDIST" pytest || fail "pip install of it failed"
    # From outside the tree, with no cargo on PATH: what a user has after the install.
    (cd "$TMP" && env PATH="$TMP/venv/bin:/usr/bin:/bin" sh -c '
        vramroom --version &&
        python -c "import vramroom; print(vramroom.parse_size(\"2GiB\"))" &&
        python -c "import os, vramroom.torch as t; p = os.path.join(os.path.dirname(t.__file__), \"libvramroom_torch.so\"); assert os.path.isfile(p), p; print(p)" &&
        python -m pytest --version >/dev/null &&
        python -c "import importlib.metadata as m; assert any(e.name == \"vramroom\" for e in m.entry_points(group=\"pytest11\"))"
    ') || fail "the install from it lacks the CLI, the API, the allocator library or the plugin"
fi
echo "check_sdist.sh: $(basename "$SDIST") ok$([ "$FULL" = 1 ] && echo " (built and installed)")"
