#!/usr/bin/env bash
# Apply scripts/renames.txt (see its header) from the repository root: word-boundary sed, old -> new.
set -euo pipefail
cd "$(dirname "$0")/.."
# Files that name the retired words on purpose: never rewritten.
KEEP='^(docs/reference/glossary\.md|tests/test_glossary\.py|outlines/draws/__init__\.py|tests/draws/test_draw\.py|scripts/renames\.txt|outlines/draws/packing\.py|outlines/runtime/batching/waiting\.py)$'
grep -v '^#' scripts/renames.txt | while read -r old new files; do
    [ -n "$old" ] || continue
    # word boundaries where the name starts or ends with a word character (``batch=True``, ``"round":``)
    left=''; right=''
    [[ "$old" =~ ^[A-Za-z0-9_] ]] && left='\b'
    [[ "$old" =~ [A-Za-z0-9_]$ ]] && right='\b'
    if [ -n "$files" ]; then
        targets=$(grep -lw -- "$old" $files || true)
    else
        targets=$(git ls-files '*.py' '*.md' | xargs grep -lw -- "$old" || true)
    fi
    for file in $targets; do
        if [[ ! "$file" =~ $KEEP ]]; then
            sed -i "s/$left$old$right/$new/g" "$file"
            echo "$old -> $new: $file"
        fi
    done
done
