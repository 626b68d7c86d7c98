"""The agent's settings: `document` reads the YAML document (its reference is there) into
the frozen dataclasses of `values`; `sections` reads and checks each section."""
