"""The README's generated blocks, one engine for the scripts that own them
(scripts/trace_corpus/readme_table.py, scripts/services/readme_table_d.py).

A block is `<!-- KIND: PATH -->`, what the KIND's renderer makes of PATH (a path from the
repository root, or several joined by commas), then `<!-- /KIND -->`, so a table and the
file it came from stay tied together. `--write README` regenerates every block of the
script's kinds; `--check README` exits 0 when each block is what its file gives, 1 (with a
diff) when one is not, and 3 (a skip, with the reason) when a file is absent: before the GPU
run that makes it.
"""
import difflib
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def render(text, renderers, repoint=None):
    """(text with every block of `renderers`' kinds regenerated, paths absent, blocks found).
    `repoint`: {kind: path} to make a block come from another file."""
    mark = re.compile(r"<!-- (%s): (\S+) -->\n(.*?)<!-- /\1 -->\n"
                      % "|".join(map(re.escape, renderers)), re.S)
    missing = []

    def sub(m):
        kind, path = m.group(1), (repoint or {}).get(m.group(1), m.group(2))
        gone = [p for p in path.split(",") if not os.path.exists(os.path.join(ROOT, p))]
        if gone:
            missing.extend(gone)
            return m.group(0)
        return "<!-- %s: %s -->\n%s<!-- /%s -->\n" % (kind, path, renderers[kind](path), kind)

    return mark.sub(sub, text), missing, bool(mark.search(text))


def main(mode, readme, renderers, what, fix, no_block_rc, repoint=None):
    """--write or --check `readme`'s blocks of `renderers`' kinds. `what` names them in the
    messages, `fix` is the command that regenerates them, `no_block_rc` the exit when the
    README has none."""
    with open(readme) as f:
        text = f.read()
    new, missing, found = render(text, renderers, repoint)
    if not found:
        print("%s: %s has no %s block" % ("skip" if no_block_rc == 3 else "error", readme, what))
        return no_block_rc
    if mode == "--write":
        with open(readme, "w") as f:
            f.write(new)
        print("wrote the %s into %s" % (what, readme))
        return 0
    if missing:
        print("skip: no results file %s (the GPU run has not been committed yet)"
              % ", ".join(missing))
        return 3
    if new != text:
        print("%s's %s: not what the results files give; regenerate with\n  %s\n"
              % (readme, what, fix))
        sys.stdout.writelines(difflib.unified_diff(
            text.splitlines(True), new.splitlines(True), "README (committed)", "from results"))
        return 1
    print("ok: %s's %s: what the results files give" % (readme, what))
    return 0
