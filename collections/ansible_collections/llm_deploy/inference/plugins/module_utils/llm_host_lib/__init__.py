"""llm_host_lib: the deploy's helper on the host, standard library only, run by the host's python3.

Who listens on a TCP port and who that process is, read from ``/proc`` (no ss or lsof), and
what follows from it. One package, three uses:

* the Ansible module ``llm_host`` (``library/llm_host.py`` of role llm_host, a dependency of
  preflight, adopt and inference_server), which AnsiballZ ships with this package: each
  subcommand below is its ``command``, the rest of the command line its ``args``, the JSON object
  the subcommand prints its ``host`` result;
* the command line ``llm-host SUBCOMMAND ...``: role llm_host's launcher ``files/llm-host``
  (the tests, molecule's adopt scenario, by hand);
* the unit's port guard: the same launcher, installed by inference_server as
  ``/usr/local/lib/<unit>/port-guard`` beside the modules the guard needs; the watchdog,
  installed beside them, imports ``restart`` from there.

All import it by its one name, module_utils of the repository's collection,
``ansible_collections.llm_deploy.inference.plugins.module_utils.llm_host_lib`` (on hosts the
copy sits at that name as a path, beside the launcher: :mod:`.install`).

Modules import each other relatively, so both names work; this ``__init__`` imports nothing.

* ``proc``: the ``/proc`` readers (listening sockets, their holders, a process's unit and user);
* ``facts``: ``facts``, what a deploy checks before it changes anything (preflight);
* ``adopt``: ``inspect``, ``record``, ``restore``, ``switch``, ``alive``, a server started by
  hand (adopt);
* ``guard``: the port guard (``port-guard PORT UNIT [GRACE_S]``, or ``guard``);
* ``restart``: the one restart sequence of the server's unit (inference_server's restart task
  through the module, the watchdog between deploys through the installed copy);
* ``cli``: the command line's dispatch;
* ``install``: the module's ``install``, the modules of the port guard and the watchdog onto the
  host (inference_server).
* ``service_dirs``: the module's ``service-dirs``, the service account's directories, made
  without following a link the account could have put there (inference_server).
* ``durable``: writes that survive a power cut (file fsynced, renamed, directory fsynced), for
  ``install`` and the modules of other roles that declare llm_host as a dependency: the
  last-known-good record (inference_server's ``last_known_good``) and the converged record
  (converged's ``converged_state``).
"""
