#!/usr/bin/env python3
"""Writes the third-party notices a binary release of `fp4forge` needs: every crate linked into
the binary (normal dependencies of the `fp4forge` package, all features, Linux targets), its
licence expression, and the text of the licence and notice files it ships, identical texts
printed once. Usage: scripts/third-party-notices.py [OUT] (default: stdout).

Fails (exit 1) if a linked crate ships no licence file, so a release never goes out with a
notice missing; `deny.toml` (cargo deny check licenses) decides which licences are allowed."""
import hashlib
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREFIXES = ("license", "licence", "copying", "notice", "copyright", "unlicense")
TARGETS = ["x86_64-unknown-linux-gnu", "aarch64-unknown-linux-gnu"]
# Crates reviewed to ship no licence file while declaring plain MIT: the notice is MIT's text
# with the authors their Cargo.toml names. Anything else without a file fails.
MIT_WITHOUT_FILE = {"number_prefix"}
MIT_TEXT = """Copyright (c) {authors}

Permission is hereby granted, free of charge, to any person obtaining a copy of this software
and associated documentation files (the "Software"), to deal in the Software without
restriction, including without limitation the rights to use, copy, modify, merge, publish,
distribute, sublicense, and/or sell copies of the Software, and to permit persons to whom the
Software is furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all copies or
substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING
BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND
NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM,
DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.
"""


def metadata():
    cmd = ["cargo", "metadata", "--format-version", "1", "--locked", "--all-features"]
    for t in TARGETS:
        cmd += ["--filter-platform", t]
    out = subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def linked_packages(meta):
    """The packages the binary links: reached from `fp4forge` through normal dependencies."""
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
    pkgs = {p["id"]: p for p in meta["packages"]}
    root = next(p["id"] for p in meta["packages"] if p["name"] == "fp4forge")
    seen, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        for dep in nodes[pid]["deps"]:
            if any(k["kind"] is None for k in dep["dep_kinds"]):
                todo.append(dep["pkg"])
    workspace = set(meta["workspace_members"])
    return sorted(
        (pkgs[i] for i in seen if i not in workspace), key=lambda p: (p["name"], p["version"])
    )


def licence_files(pkg):
    d = os.path.dirname(pkg["manifest_path"])
    names = sorted(
        f for f in os.listdir(d)
        if f.lower().startswith(PREFIXES) and os.path.isfile(os.path.join(d, f))
    )
    if pkg.get("license_file"):
        lf = os.path.normpath(os.path.join(d, pkg["license_file"]))
        rel = os.path.relpath(lf, d)
        if os.path.isfile(lf) and rel not in names:
            names.append(rel)
    return [(n, open(os.path.join(d, n), encoding="utf-8", errors="replace").read()) for n in names]


def main():
    meta = metadata()
    out = []
    texts = {}
    missing = []
    out.append("Third-party software in fp4forge\n================================\n\n")
    out.append(
        "fp4forge is licensed under the Apache License 2.0 (LICENSE). The binary links the\n"
        "crates below; each is listed with its licence expression and the licence and notice\n"
        "files it ships (identical texts are printed once and referred to by number).\n\n"
    )
    listing = []
    for pkg in linked_packages(meta):
        files = licence_files(pkg)
        if not files and pkg["name"] in MIT_WITHOUT_FILE and pkg.get("license") == "MIT":
            authors = ", ".join(pkg.get("authors") or []) or f"the {pkg['name']} authors"
            files = [("MIT (no file in the crate)", MIT_TEXT.format(authors=authors))]
        if not files:
            missing.append(f"{pkg['name']} {pkg['version']} ({pkg.get('license')})")
        refs = []
        for name, text in files:
            h = hashlib.sha256(text.strip().encode()).hexdigest()
            if h not in texts:
                texts[h] = (len(texts) + 1, name, pkg["name"], text)
            refs.append(f"{name} [{texts[h][0]}]")
        listing.append(
            f"- {pkg['name']} {pkg['version']}: {pkg.get('license') or 'no licence field'}"
            f"{' -- ' + ', '.join(refs) if refs else ''}\n"
        )
    out.extend(listing)
    out.append("\nLicence and notice texts\n------------------------\n")
    for num, name, first, text in texts.values():
        out.append(f"\n[{num}] {name} (first shipped by {first})\n\n{text.rstrip()}\n")
    if missing:
        sys.stderr.write(
            "third-party-notices: these linked crates ship no licence file:\n  "
            + "\n  ".join(missing) + "\n"
        )
        return 1
    text = "".join(out)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
