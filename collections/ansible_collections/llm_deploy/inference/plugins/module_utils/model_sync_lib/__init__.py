"""model_sync_lib: put a model on a host atomically, resumably, verified.

The engine behind the ``model_sync`` module (``library/model_sync.py`` of role model_sync,
which ships this package through AnsiballZ) and the ``model-sync`` command (the role's launcher
``files/model-sync``, in ``/usr/local/lib/model-sync`` on hosts beside this package's copy).
Both import it by its one name, module_utils of the repository's collection:
``ansible_collections.llm_deploy.inference.plugins.module_utils.model_sync_lib``. Modules
import each other relatively, and only the Python standard library is used, so the host's
``python3`` runs it.

Layout it maintains (``dest`` is ``<model_sync_root>/<model_sync_name>``)::

    dest/.incoming/              latest snapshot of the source (rsync target / copy target /
                                 huggingface_hub local_dir); interrupted transfers resume here
    dest/revisions/<rev>.partial staging of a revision being assembled (hard links)
    dest/revisions/<rev>/        verified revisions (hard links into the same inodes)
    dest/current -> revisions/<rev>   switched with rename(2) of a temporary symlink

sha256 sums are cached in ``<state_dir>/<key>.state`` by inode with size and mtime, so an
unchanged model is never read again.

Modules, one concern each (imports are lazy where they cost start-up time: a no-op run
imports neither ``json`` nor ``re``):

* ``common``: layout names, :class:`~.common.SyncError`, small helpers;
* ``fs``: scanning, kernel copies, write-back, fsync, and publishing by rename what must survive a
  power cut (``publish``, ``atomic_write``: content fsynced, renamed, directory fsynced);
* ``hashing``: sha256 of files, in parallel;
* ``state``: the sha256 cache and revision manifests;
* ``checks``: manifests, safetensors headers, the model check, revision labels;
* ``base``: the engine's configuration, plan, ownership, lock and disk space;
* ``fetch_local``, ``fetch_rsync``, ``fetch_hub``: the three fetchers into ``.incoming``
  (``hub_helper`` is the program ``fetch_hub`` runs in the target venv);
* ``revisions``: staging, repair, switch and prune;
* ``engine``: verification, the sync action and the dispatch of actions;
* ``diff``: the Ansible diff of a result;
* ``install``: the module's ``install`` action (this package onto the host, for the command);
* ``compact_json``, ``cli``: the command line (its own JSON encoder and argv parser).
"""
