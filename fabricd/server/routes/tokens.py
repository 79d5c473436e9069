"""``/api/v1/tokens`` (admin): list, create (the token is shown once), revoke."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from fabricd.server.api_models import TokenCreate, TokenCreated, TokenOut
from fabricd.server.deps import Admin, Svc, TokensDep
from fabricd.server.errors import not_found
from fabricd.server.routes.common import AUTH_ERRORS, NOT_FOUND
from fabricd.server.store.records import NotFound

router = APIRouter(tags=["tokens"])


@router.get("/api/v1/tokens", response_model=list[TokenOut], responses=AUTH_ERRORS, summary="Tokens (admin)")
def list_tokens(tokens: TokensDep, _who: Admin) -> list[TokenOut]:
    return [TokenOut.of(i) for i in tokens.all()]


@router.post(
    "/api/v1/tokens",
    response_model=TokenCreated,
    status_code=201,
    responses=AUTH_ERRORS,
    summary="Create a token (admin)",
)
def create_token(svc: Svc, tokens: TokensDep, _who: Admin, body: TokenCreate) -> TokenCreated:
    tid, token = tokens.create(body.role, svc.clock(), body.node, body.note)
    info = next(i for i in tokens.all() if i.id == tid)
    return TokenCreated(**TokenOut.of(info).model_dump(), token=token)


@router.delete(
    "/api/v1/tokens/{token_id}",
    response_model=TokenOut,
    responses={**AUTH_ERRORS, **NOT_FOUND},
    summary="Revoke a token (admin)",
)
def revoke_token(svc: Svc, tokens: TokensDep, _who: Admin, token_id: Annotated[int, Path(ge=1, le=2**62)]) -> TokenOut:
    try:
        return TokenOut.of(tokens.revoke(str(token_id), svc.clock()))
    except NotFound as exc:
        raise not_found(str(exc)) from exc
