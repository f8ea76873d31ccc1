"""The machine: is this host ready (doctor, check, container, peer), and what fits on it (planner: `invoke plan`,
the front end of dockyard.common.memory).

The top of the host side: it may read images, launch and transport (doctor starts a container the way `invoke run`
does, peer reaches a node the way transport ships to it); none of them reads it.
"""
