"""``python -m shoal.stub.autocomplete MODEL_FILE [RUNTIME_FILE]``: run ``auto_complete_config``.

Triton runs it at load, in a throw-away process, before any instance starts. The configuration
as written comes in as JSON on stdin; the completed one goes out as JSON on stdout. Any failure
exits non-zero with the reason on stderr, which becomes the model's load error. MODEL_FILE is
the version's ``model.py`` (``get_model_dir()`` is its directory, as in ``execute``);
RUNTIME_FILE, when given, is the ``model.py`` of the model's Python-based backend, which runs
instead.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

from shoal.stub import loader, pb_utils


def complete(model_file: str, config_json: str, runtime_file: str = "") -> dict[str, object]:
    loader.install_pb_utils()
    pb_utils._set_model_dir(os.path.dirname(model_file))
    module = loader.import_model(model_file, runtime_file)
    model_class = loader.model_class(module, model_file)
    auto_complete = getattr(model_class, "auto_complete_config", None)
    config = pb_utils.ModelConfig(config_json)
    if auto_complete is None:
        return config.as_dict()
    result = auto_complete(config)
    if not isinstance(result, pb_utils.ModelConfig):
        name = json.loads(config_json).get("name", model_file)
        raise TypeError(
            f"auto_complete_config function in model '{name}' must return a valid "
            "pb.ModelConfig object."
        )
    return result.as_dict()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (1, 2):
        print(
            "usage: python -m shoal.stub.autocomplete MODEL_FILE [RUNTIME_FILE] < config.json",
            file=sys.stderr,
        )
        return 2
    try:
        completed = complete(args[0], sys.stdin.read(), args[1] if len(args) > 1 else "")
    except BaseException:
        print(traceback.format_exc().rstrip(), file=sys.stderr)
        return 1
    sys.stdout.write(json.dumps(completed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
