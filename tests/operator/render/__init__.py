"""render/: spec -> Service and Pod dicts, pure; golden YAML in ../golden/."""
