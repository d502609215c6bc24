"""Block sizes under load: rules that choose every active row's block size each round, from the
load and each row's acceptance so far (:mod:`adaptspec.load.rules`). The same rule objects run in
the load simulator (:mod:`adaptspec.simulators.load`) and in the batched engine's server loop."""
