"""sharetune's developer tooling (the ``sharetune-dev`` distribution in ``devtools/``): a real
local Kubernetes control plane built from source (``cluster``), the process kubelet that runs
kwok-bound pods as local processes (``podsim``), the Grafana dashboard generator (``dashboard``).

Not part of the product: no Dockerfile copies it, and ``sharetune`` never imports it; the
``sharetune cluster`` subcommand comes from this distribution's ``sharetune.commands`` entry point.
"""
