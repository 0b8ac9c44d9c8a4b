"""The ``--json`` documents, one module per schema in ``schemas/`` (``stats`` for
``stats.schema.json``, ``action`` for ``action.schema.json``, ...), and one per command whose
document has no schema yet (``consume``, ``demo``, ``outbox``). Each builds its document
from what the library returns (``idemctl.operate``'s results, reports): the CLI prints them
with ``--json``, the console serves them under ``/api/``. Records and entities are their
own ``to_json``.

A document's first fields name the store it ran on: ``where`` is ``{"store": URL,
"store_source": SOURCE}``, the URL redacted."""
