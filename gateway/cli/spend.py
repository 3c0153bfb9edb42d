"""``tiergate prices`` and ``tiergate budgets``: what each model's tokens cost, and the spend
budgets of tenants and keys (the same crud calls as ``/admin/v1/prices`` and
``/admin/v1/budgets``; running gateways pick a change up within seconds)."""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated

import typer

from gateway.cli._common import actor, console, print_table, transaction
from gateway.db.crud import budgets, prices
from gateway.db.models import BUDGET_PERIODS, utcnow
from gateway.db.money import plain
from gateway.db.security import display_prefix
from gateway.limits.budget import budget_state, period_bounds

prices_app = typer.Typer(help="Model prices (per million tokens).", no_args_is_help=True)
budgets_app = typer.Typer(help="Spend budgets of tenants and keys.", no_args_is_help=True)


@prices_app.command("set")
def prices_set(
    model: Annotated[str, typer.Argument(help="model name, as clients ask for it")],
    prompt: Annotated[str, typer.Option(help="price of 1M prompt tokens, e.g. 0.15")],
    completion: Annotated[str, typer.Option(help="price of 1M completion tokens, e.g. 0.60")],
) -> None:
    """Price a model, or change its price (later usage records are charged at it)."""
    with transaction() as session:
        found = prices.find_price(session, model)
        if found is None:
            row = prices.create_price(
                session,
                actor=actor(),
                model=model,
                prompt_per_mtok=prompt,
                completion_per_mtok=completion,
            )
        else:
            changes = {"prompt_per_mtok": prompt, "completion_per_mtok": completion}
            row = prices.update_price(session, found.id, changes, actor=actor())
        shown = (plain(row.prompt_per_mtok), plain(row.completion_per_mtok))
    console.print(f"price of [bold]{model}[/]: {shown[0]} prompt, {shown[1]} completion per 1M")


@prices_app.command("list")
def prices_list() -> None:
    """List model prices."""
    with transaction() as session:
        rows = [
            (p.model, plain(p.prompt_per_mtok), plain(p.completion_per_mtok))
            for p in prices.list_prices(session)
        ]
    print_table("prices", ("model", "prompt / 1M", "completion / 1M"), rows)


@prices_app.command("delete")
def prices_delete(model: Annotated[str, typer.Argument(help="model name")]) -> None:
    """Remove a model's price (its later records carry no cost)."""
    with transaction() as session:
        prices.delete_price(session, prices.get_price(session, model).id, actor=actor())
    console.print(f"deleted the price of [bold]{model}[/]")


@budgets_app.command("add")
def budgets_add(
    amount: Annotated[str, typer.Argument(help="the budget, in the prices' currency")],
    period: Annotated[str, typer.Option(help=f"one of {', '.join(BUDGET_PERIODS)} (UTC)")],
    tenant: Annotated[str | None, typer.Option(help="tenant name (a tenant's budget)")] = None,
    key: Annotated[str | None, typer.Option(help="key prefix (a key's budget)")] = None,
    soft: Annotated[
        float | None, typer.Option(help="warn past this fraction of the budget, e.g. 0.8")
    ] = None,
    webhook: Annotated[str | None, typer.Option(help="URL told of the soft threshold")] = None,
) -> None:
    """Add a budget to a tenant or a key."""
    with transaction() as session:
        row = budgets.create_budget(
            session,
            actor=actor(),
            tenant=tenant,
            key=key,
            period=period,
            amount=amount,
            soft_fraction=soft,
            webhook_url=webhook,
        )
        budget_id = row.id
    console.print(f"added budget [bold]{budget_id}[/]")


@budgets_app.command("list")
def budgets_list() -> None:
    """List budgets with what their current period has spent."""
    now = utcnow()
    with transaction() as session:
        rows = []
        for b in budgets.list_budgets(session):
            start, end = period_bounds(b.period, now)
            spent = budgets.spent_in(session, b.tenant_id, b.api_key_id, start, end)
            key = display_prefix(b.api_key.prefix) if b.api_key is not None else None
            state = budget_state(spent, b.amount, b.soft_fraction)
            amount, spent_text = (_six(b.amount), _six(spent))
            rows.append(
                (b.id, b.tenant.name, key, b.period, amount, spent_text, state, f"{end:%Y-%m-%d}")
            )
    columns = ("id", "tenant", "key", "period", "amount", "spent", "state", "resets")
    print_table("budgets", columns, rows)


def _six(amount: Decimal) -> str:
    """An amount to six decimals: a table column that fits a terminal."""
    return f"{amount.quantize(Decimal('0.000001'))}"


@budgets_app.command("delete")
def budgets_delete(budget_id: Annotated[int, typer.Argument(help="budget id")]) -> None:
    """Delete a budget."""
    with transaction() as session:
        budgets.delete_budget(session, budget_id, actor=actor())
    console.print(f"deleted budget [bold]{budget_id}[/]")
