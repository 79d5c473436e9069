"""API tokens: their digests, roles, node bindings and revocations (ORM).

Only the digest is stored (``auth.token_digest``); the token itself is returned once by ``create``.
"""

from __future__ import annotations

import hmac

from sqlalchemy import select
from sqlalchemy.orm import sessionmaker

from fabricd.server import tables as t
from fabricd.server.auth import ROLES, new_token, token_digest
from fabricd.server.store.records import NotFound, TokenInfo
from fabricd.server.store.sql import Database


class Tokens:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.sessions = sessionmaker(db.engine, expire_on_commit=False)

    def create(self, role: str, now: float, node: str | None = None, note: str = "") -> tuple[int, str]:
        """A new token of ``role`` (bound to ``node`` if given): (its id, the token)."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
        token = new_token()
        with self.db.write_lock, self.sessions.begin() as s:
            row = t.Token(digest=token_digest(token), role=role, node=node or None, note=note, created_ts=now)
            s.add(row)
            s.flush()
            return row.id, token

    def find(self, token: str) -> TokenInfo | None:
        digest = token_digest(token)
        with self.sessions() as s:
            row = s.scalars(select(t.Token).where(t.Token.digest == digest)).first()
            if row is None or not hmac.compare_digest(row.digest, digest) or row.revoked_ts is not None:
                return None
            return _info(row)

    def revoke(self, id_or_token: str, now: float) -> TokenInfo:
        """Revoke by id (digits) or by the token itself; revoking twice keeps the first time."""
        by_id = id_or_token.isdigit()
        cond = t.Token.id == int(id_or_token) if by_id else t.Token.digest == token_digest(id_or_token)
        with self.db.write_lock, self.sessions.begin() as s:
            row = s.scalars(select(t.Token).where(cond)).first()
            if row is None:
                raise NotFound("no such token (give its id from `fabricd token list`, or the token itself)")
            if row.revoked_ts is None:
                row.revoked_ts = now
            return _info(row)

    def all(self) -> list[TokenInfo]:
        with self.sessions() as s:
            return [_info(r) for r in s.scalars(select(t.Token).order_by(t.Token.id))]

    def has_admin(self) -> bool:
        q = select(t.Token.id).where(t.Token.role == "admin", t.Token.revoked_ts.is_(None)).limit(1)
        with self.sessions() as s:
            return s.execute(q).first() is not None


def _info(row: t.Token) -> TokenInfo:
    return TokenInfo(row.id, row.role, row.node, row.note, row.created_ts, row.revoked_ts)
