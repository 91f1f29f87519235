"""Tier A config: one YAML file per node, read once at start.

    from crewlet.config import load_node_config, ConfigError
    try:
        cfg = load_node_config(path)        # None: $CREWLET_CONFIG, /etc/crewlet/crewlet.yaml, else defaults
    except ConfigError as e:
        sys.exit(f"crewletd: {e}")          # one line: <file>: <key>: <problem>; exit code e.EXIT_CODE
    for w in cfg.warnings: log.warning(w)

``crewlet/config/model.py`` holds the models and is the one place defaults
live; ``crewlet/config/load.py`` documents file lookup, ``${VAR}`` expansion
and error formatting. ``etc/crewlet.yaml`` is the annotated example.
"""

from .load import DEFAULT_CONFIG_PATHS, ConfigError, expand_env, load_node_config
from .model import NodeConfig

__all__ = ["DEFAULT_CONFIG_PATHS", "ConfigError", "NodeConfig", "expand_env", "load_node_config"]
