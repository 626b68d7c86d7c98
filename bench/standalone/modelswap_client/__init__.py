"""A stand-in for `modelswap_client` inside a plain Triton (the cold-path baseline of
`bench.compare`): `client.attach` gives in-process memory instead of asking an agent, so
the example models run unchanged the way users run models today (weights read from the
model's files at load time into the process's own memory). Every other module (kvpool,
regions) is the real one: the bench names the real package's folder in
MODELSWAP_REAL_CLIENT and this package's path continues there."""

import os

__path__.append(os.environ["MODELSWAP_REAL_CLIENT"])  # type: ignore[name-defined]
