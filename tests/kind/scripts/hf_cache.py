"""Lay out a checkpoint as Hugging Face's cache has it after a download (run in a fill Job):

    python hf_cache.py CHECKPOINT_DIR HF_HOME REPO_ID COMMIT

hub/models--org--name/{blobs/<sha256>, snapshots/<commit>/<file> -> ../../blobs/<sha256>, refs/main}.
"""

import hashlib
import sys
from pathlib import Path

checkpoint, home, repo_id, commit = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
repo = home / "hub" / f"models--{repo_id.replace('/', '--')}"
snapshot = repo / "snapshots" / commit
(repo / "blobs").mkdir(parents=True, exist_ok=True)
snapshot.mkdir(parents=True, exist_ok=True)
(repo / "refs").mkdir(exist_ok=True)
(repo / "refs" / "main").write_text(commit)
for path in sorted(checkpoint.iterdir()):
    if path.is_file():
        data = path.read_bytes()
        blob = hashlib.sha256(data).hexdigest()
        (repo / "blobs" / blob).write_bytes(data)
        (snapshot / path.name).symlink_to(Path("../../blobs") / blob)
print(f"{repo_id}@{commit}: {len(list(snapshot.iterdir()))} files in {home}")
