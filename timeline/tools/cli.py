"""``timeline``: the admin command line (init, token, revoke, secret, stats, poison,
rebalance, regrade, run)."""

from __future__ import annotations

import argparse
import asyncio
import sys

from timeline.config import Settings
from timeline.delivery.regrade import queue_due_regrades
from timeline.errors import TimelineError
from timeline.logs import configure_logging
from timeline.model.tokens import TokenSigner
from timeline.startup import load_settings
from timeline.storage.accounts import Storage
from timeline.storage.queue import FanoutQueues
from timeline.storage.rebalance import Rebalancer
from timeline.tables.credentials import CredentialsRepository
from timeline.tables.repositories import Repositories
from timeline.tables.secret import list_keys, load_key_ring, retire_key, rotate_key
from timeline.tables.users import UsersRepository
from timeline.tools.poison import drop_poison, requeue_one_poison
from timeline.tools.stack import Stack
from timeline.tools.views import one_line, poison_lines, stats_lines


async def cmd_init(_settings: Settings, storage: Storage, _args: argparse.Namespace) -> None:
    await storage.create_all()
    print("tables and queues are ready")


async def cmd_token(settings: Settings, storage: Storage, args: argparse.Namespace) -> None:
    if not await UsersRepository(storage).exists(args.user):
        raise TimelineError(f"user {args.user!r} does not exist", code="user_not_found")
    ring = await load_key_ring(storage, settings.auth_secret)
    epoch = (await CredentialsRepository(storage).state(args.user)).epoch
    signer = TokenSigner(ring, token_ttl_s=settings.token_ttl_s)
    print(signer.mint_bearer(args.user, epoch=epoch))


async def cmd_revoke(_settings: Settings, storage: Storage, args: argparse.Namespace) -> None:
    epoch = await CredentialsRepository(storage).revoke_all(args.user)
    print(f"every token of {args.user!r} minted so far is revoked (epoch {epoch})")


async def cmd_secret_list(settings: Settings, storage: Storage, _args: argparse.Namespace) -> None:
    await load_key_ring(storage, settings.auth_secret)
    keys = await list_keys(storage)
    for key in keys:
        signs = "\tsigns new tokens" if key is keys[-1] else ""
        print(f"key {key.key_id}\tadded {key.created}{signs}")


async def cmd_secret_rotate(
    settings: Settings, storage: Storage, _args: argparse.Namespace
) -> None:
    key_id = await rotate_key(storage, settings.auth_secret)
    print(
        f"key {key_id} added: API processes sign new tokens with it within "
        f"{settings.credentials_cache_s:g} s; older keys verify until retired"
    )


async def cmd_secret_retire(settings: Settings, storage: Storage, args: argparse.Namespace) -> None:
    await retire_key(storage, settings.auth_secret, args.key_id)
    print(
        f"key {args.key_id} retired: its tokens are refused by every API process within "
        f"{settings.credentials_cache_s:g} s"
    )


async def cmd_stats(_settings: Settings, storage: Storage, _args: argparse.Namespace) -> None:
    print("\n".join(await stats_lines(storage)))


async def cmd_poison_list(_settings: Settings, storage: Storage, args: argparse.Namespace) -> None:
    print("\n".join(poison_lines(await FanoutQueues(storage).peek_poison(args.count))))


async def cmd_poison_drop(_settings: Settings, storage: Storage, args: argparse.Namespace) -> None:
    reason = await drop_poison(FanoutQueues(storage), args.id)
    print(f"dropped poison message {args.id} ({one_line(reason, 120)})")


async def cmd_poison_requeue(
    _settings: Settings, storage: Storage, args: argparse.Namespace
) -> None:
    if args.id is not None:
        reason = await requeue_one_poison(FanoutQueues(storage), args.id)
        print(f"requeued poison message {args.id} ({one_line(reason, 120)})")
        return
    moved = await FanoutQueues(storage).requeue_poison(args.count)
    print(f"requeued {moved} message(s)")


async def cmd_rebalance(settings: Settings, storage: Storage, args: argparse.Namespace) -> None:
    margin = settings.rebalance_margin_s
    report = await Rebalancer(storage, margin_s=margin, steps=args.steps).run()
    print(
        f"placement version {report.version} is settled on {report.accounts} account(s): "
        f"{report.partitions} partition(s) and {report.rows} row(s) moved, "
        f"{report.removed} old row(s) removed"
    )


async def cmd_regrade(settings: Settings, storage: Storage, args: argparse.Namespace) -> None:
    hybrid = settings.hybrid(FanoutQueues(storage))
    sent = await queue_due_regrades(
        Repositories.on(storage), hybrid, args.users or None, resume=args.resume
    )
    print(f"queued {len(sent)} regrade(s){': ' if sent else ''}{' '.join(sent)}")


async def run_with_storage(settings: Settings, args: argparse.Namespace) -> None:
    """Run the command ``args`` names on the configured storage."""
    async with Storage(settings.connection_string(), settings.storage_options()) as storage:
        await args.func(settings, storage, args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="timeline", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("init", help="create tables and queues").set_defaults(func=cmd_init)
    token = commands.add_parser("token", help="mint a bearer token for an existing user")
    token.add_argument("user")
    token.set_defaults(func=cmd_token)
    revoke = commands.add_parser("revoke", help="revoke every token of a user minted so far")
    revoke.add_argument("user")
    revoke.set_defaults(func=cmd_revoke)
    secret = commands.add_parser("secret", help="the bearer-token key ring (docs/security.md)")
    secret_commands = secret.add_subparsers(dest="secret_command", required=True)
    secret_commands.add_parser("list", help="the key ids, oldest first").set_defaults(
        func=cmd_secret_list
    )
    secret_commands.add_parser("rotate", help="add a key that signs new tokens").set_defaults(
        func=cmd_secret_rotate
    )
    retire = secret_commands.add_parser("retire", help="refuse the tokens an older key signed")
    retire.add_argument("key_id")
    retire.set_defaults(func=cmd_secret_retire)
    commands.add_parser(
        "stats",
        help="queue depths (ready apart from delayed) and table counts (people's rows "
        "apart from internal ones)",
    ).set_defaults(func=cmd_stats)
    commands.add_parser("run", help="run storage, API and worker")
    rebalance = commands.add_parser(
        "rebalance", help="move partitions onto accounts added at the end of the list"
    )
    rebalance.add_argument(
        "--steps", type=int, default=8, help="slot ranges moved one after another (default 8)"
    )
    rebalance.set_defaults(func=cmd_rebalance)
    regrade = commands.add_parser(
        "regrade",
        help="move authors across TIMELINE_FANOUT_ON_READ_FOLLOWERS where their reach "
        "(followers and list memberships) says so (after turning hybrid fan-out on or "
        "changing the threshold)",
    )
    regrade.add_argument("users", nargs="*", help="these authors (default: every author)")
    regrade.add_argument(
        "--resume",
        action="store_true",
        help="also send again the moves left midway (after their message was poisoned)",
    )
    regrade.set_defaults(func=cmd_regrade)
    poison = commands.add_parser("poison", help="inspect, requeue or drop failed messages")
    poison_commands = poison.add_subparsers(dest="poison_command", required=True)
    listing = poison_commands.add_parser("list", help="show poison messages with their reasons")
    listing.add_argument("--count", type=int, default=32, choices=range(1, 33), metavar="1..32")
    listing.set_defaults(func=cmd_poison_list)
    requeue = poison_commands.add_parser(
        "requeue", help="move poison messages back to work (one by its ID, else up to --count)"
    )
    requeue.add_argument("id", nargs="?", help="the ID `poison list` shows")
    requeue.add_argument("--count", type=int, default=32, choices=range(1, 33), metavar="1..32")
    requeue.set_defaults(func=cmd_poison_requeue)
    drop = poison_commands.add_parser("drop", help="delete one poison message for good")
    drop.add_argument("id", help="the ID `poison list` shows")
    drop.set_defaults(func=cmd_poison_drop)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    settings = load_settings("timeline")
    configure_logging(settings.log_format)
    try:
        if args.command == "run":
            sys.exit(Stack(settings).run())
        asyncio.run(run_with_storage(settings, args))
    except TimelineError as error:
        print(f"timeline: {error.message}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
