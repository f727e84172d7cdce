"""The naive Flask baseline the upload benchmark compares against.

The same three routes as the real app, written the obvious way: `request.files` (Werkzeug
spools each file to a temporary file) and `FileStorage.save()` (which copies it a second
time), `os.listdir` plus `os.stat` for the list, `send_file` for the download, all under
Werkzeug's threaded development server. No limits, no records, no hashing, no atomic commit:
it is a yardstick, not an implementation to copy.

    .venv/bin/python bench/naive_app.py --host 127.0.0.1 --port 2027 --data-dir /tmp/naive
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from flask import Flask
from flask import abort
from flask import request
from flask import send_file
from werkzeug.utils import secure_filename


def create_app(data_dir: Path) -> Flask:
    """A Flask app storing uploads under `{data_dir}/threads/{id}/user-data/uploads`."""
    app = Flask(__name__)

    def uploads_dir(thread_id: str) -> Path:
        if not thread_id.replace("-", "").replace("_", "").isalnum():
            abort(400)
        return data_dir / "threads" / thread_id / "user-data" / "uploads"

    def info(
        thread_id: str, folder: str, name: str, size: int, modified: float | None = None
    ) -> dict:
        virtual = f"/mnt/user-data/uploads/{name}"
        return {
            "filename": name,
            "size": size,
            "path": os.path.join(folder, name),
            "virtual_path": virtual,
            "artifact_url": f"/api/threads/{thread_id}/artifacts{virtual}",
            "modified": modified,
        }

    @app.post("/api/threads/<thread_id>/uploads")
    def upload(thread_id: str):
        folder = uploads_dir(thread_id)
        folder.mkdir(parents=True, exist_ok=True)
        files = []
        for storage in request.files.getlist("files"):
            name = secure_filename(storage.filename or "")
            if not name:
                continue
            target = folder / name
            storage.save(target)
            files.append(info(thread_id, str(folder), name, target.stat().st_size))
        if not files:
            return {"detail": "No files provided"}, 400
        return {
            "success": True,
            "files": files,
            "message": f"Successfully uploaded {len(files)} file(s)",
        }

    @app.get("/api/threads/<thread_id>/uploads/list")
    def list_uploads(thread_id: str):
        folder = str(uploads_dir(thread_id))
        files = []
        if os.path.isdir(folder):
            for name in sorted(os.listdir(folder)):
                st = os.stat(os.path.join(folder, name))
                files.append(info(thread_id, folder, name, st.st_size, st.st_mtime))
        return {"files": files, "count": len(files)}

    @app.get("/api/threads/<thread_id>/artifacts/mnt/user-data/uploads/<name>")
    def download(thread_id: str, name: str):
        path = uploads_dir(thread_id) / secure_filename(name)
        if not path.is_file():
            abort(404)
        return send_file(path, conditional=True, download_name=path.name)

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=2027)
    parser.add_argument("--data-dir", type=Path, required=True)
    args = parser.parse_args()
    args.data_dir.mkdir(parents=True, exist_ok=True)
    app = create_app(args.data_dir.resolve())
    # Werkzeug's development server, threaded, as `flask run` would serve it (no reloader,
    # no debugger: those would only slow the baseline down).
    app.run(host=args.host, port=args.port, threaded=True, debug=False, use_reloader=False)


if __name__ == "__main__":
    main()
