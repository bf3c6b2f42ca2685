"""What a trial leaves behind, and how it is kept: `record.py` (the Record dataclass whose fields are the schema, the
job key every reader groups by, and the JSON Lines store), `upgrade.py` (the steps that read older files),
`rewrite.py` (an older file's lines rewritten in the current schema), `benchjson.py` (pytest-benchmark JSON read as
records), `environment.py` (the environment stamp), `nvidia.py` (the GPU's driver, clocks, temperature, ECC and other
processes as nvidia-smi reports them, the nightly's pre-flight and baseline key), `exits.py` (the one exit-code
table), `oom.py` (the one test for "this failure was out of memory").

Adding a field: a typed field with its unit in its name on Record; renaming one needs a schema bump and an
upgrade step.

May import: nothing else of optbench.
"""
