"""The estate: the company's durable state, one log, a full copy on every data node.

DESIGN §6 and the reference ("Every data node is a full replica", "How a
request reaches the estate"). Tasks, comments, knowledge-base pages, file
rows, turn records, episodes, the seat diary and conversations (their runs,
messages and approvals: DESIGN §11) are written as
**operations** on one ordered log, the ``ESTATE`` stream, and every data
node's ``data_applier`` applies that log, in order and deterministically,
into its own LMDB environment. Two data nodes that applied the same log hold
the same tables, byte for byte.

Following a write, by folder:

==========================  =================================================
``ops.py``                  what an operation is: id, kind, args, seat and
                            fencing token, node, time; the kinds and their
                            argument schemas, the read queries
``router.py``               where a request goes: this node's copy first when
                            it is in service, else the data nodes in order
``view.py``                 which data nodes there are and how each is doing
                            (presence, ``status``), as the router needs it
``local.py``                this node's own copy, from another role's process:
                            reads straight from LMDB, writes via the applier
``wire.py``                 the applier's request and answer shapes (ZeroMQ
                            for the node's own roles, NATS for everyone)
``log.py``                  the ``ESTATE`` stream and publishing an op to it
``origins.py``              who may write what: each way in names its origin
                            (the role), and the kinds each origin may carry
``apply.py``                what an op does to the tables: one function per
                            kind, the fence, each op id's outcome kept
``store.py``                the LMDB layout, the read queries, the digest
``search.py``               the knowledge base's full-text index (SQLite FTS5),
                            derived from the ``pages`` table
==========================  =================================================

The applier itself, the one writer of a node's copy, is the
``data_applier`` role (:mod:`roles.data_applier`).

Three numbers carry the consistency model. An op's **seq** is where it landed
in the log. A copy's **applied** sequence is how far it has applied the log.
A caller's **floor** is the highest seq of its own writes: every request
carries it, and a copy answers only once it has applied the floor (or says it
is behind), so a caller reads its own writes whichever data node answers.
"""
