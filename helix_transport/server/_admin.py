"""``helix.admin.v1.AdminService``: operations on a service's store, for its admins only.

An admin is an authenticated principal the service names (``ServerConfig.admins``,
``--admin-principal``) and that belongs to no tenant: an operator of the deployment,
not a user of one of its tenants. ``anonymous`` never is, so a service without
authentication answers every admin call with ``PERMISSION_DENIED``.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import Any

import grpc

from helix_transport._exceptions import InvalidArgument, PermissionDenied
from helix_transport._proto.helix.admin.v1 import admin_pb2 as pb
from helix_transport._proto.helix.admin.v1 import admin_pb2_grpc as pb_grpc
from helix_transport.server._identity import ANONYMOUS, current_principal
from helix_transport.store import Store, sweep

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["AdminService"].full_name


class AdminServicer(pb_grpc.AdminServiceServicer):
    """Sweeps ``store`` for the principals named in ``admins``."""

    def __init__(self, store: Store, admins: Iterable[str]) -> None:
        self.store = store
        self.admins = frozenset(admins) - {ANONYMOUS.name}

    async def Sweep(
        self, request: pb.SweepRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.SweepResponse:
        caller = current_principal()
        if caller.tenant or caller.name not in self.admins:
            raise PermissionDenied(
                f"{caller.name!r} is not an admin of this service (--admin-principal names "
                "admins: authenticated principals of no tenant)"
            )
        if not request.HasField("retention"):
            raise InvalidArgument("retention", "required")
        retention = request.retention.ToTimedelta()
        if retention <= timedelta(0):
            raise InvalidArgument("retention", "must be positive")
        report = await sweep(self.store, retention=retention, dry_run=request.dry_run)
        return pb.SweepResponse(expired_session_ids=report.expired, dry_run=report.dry_run)
