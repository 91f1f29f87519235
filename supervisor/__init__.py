"""The node's OTP-style supervision machinery and crewletd.

* :mod:`supervisor.spec` — child specs, flags, the names they use
* :mod:`supervisor.states` — child states and the moves between them
* :mod:`supervisor.supervisor` — the supervisor: strategies, intensity, backoff
* :mod:`supervisor.zygote` — the preloaded process children are forked from
* :mod:`supervisor.process` — process children, the health socket, the reaper
* :mod:`supervisor.procs` — prctl, process groups, what an exit means
* :mod:`supervisor.control` — the ``control`` endpoint's commands
* :mod:`supervisor.node` — one node's tree, its signals and its lifetime
* :mod:`supervisor.crewletd` — the ``crewletd`` command
"""
