"""The fan-out protocol: what the worker does with each kind of message, and why it ends right.

``processor`` hands each message to the module of its kind: ``post`` (a post's delivery),
``delete``, ``follow`` (follow and unfollow) and ``regrade`` (an author's move between copied
and merged). They share ``context`` (repositories, writer, settings, admission), ``feed`` (every
write to a reader's timeline), ``outcomes`` and ``settings``.
"""
