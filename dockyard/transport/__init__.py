"""Moving images between nodes: archives (save, load), thin archives, ssh, commit.

One module per concern; each imports only modules listed before it (and dockyard.engine / console):
  frames      compressed frames, one per large layer, and their cache
  tarstream   the `docker save` tar reader (TarPump): hashes every layer, leaves out omitted ones
  layout      an archive set on disk: file names, compression choices, the .sha256, load.sh
  inventory   what an engine holds (images, chain ids, image store) and what a thin archive omits
  remote      a node over ssh: destinations, remote commands, its state, its inventory
  load        `invoke load`: sha256, manifest and signature checks, then the load
  save        `invoke save`: the archive set
  ship        an archive (file mode) or an image (stream mode) to a node over ssh
  commit      a container to an image, refusing secrets
"""
