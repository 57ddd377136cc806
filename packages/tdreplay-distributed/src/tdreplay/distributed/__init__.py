"""tdreplay.distributed: replay buffers served by Ray actors.

:class:`RayReplayBuffer` puts one buffer in a Ray actor that collectors and learners in any
process share (found by name with :meth:`RayReplayBuffer.attach`); :class:`ShardedReplayBuffer`
spreads a buffer over several actors and samples them as one, prioritized sampling included.
Both pickle, so Ray tasks and actors can be handed them. :class:`RemoteTensorDictReplayBuffer`
is TorchRL's buffer for ``torch.distributed.rpc``; :class:`DistributedBufferClient` is a client
whose data travels over ``torch.distributed`` (``transport="distributed"``). Ray is imported on
first use.
"""

from .errors import (
    BufferActorDiedError,
    BufferNotFoundError,
    BufferStartError,
    BufferStateLostError,
    RemoteBufferError,
    RemoteCallTimeoutError,
    ShardsUnavailableWarning,
)
from .ray_buffer import RayReplayBuffer
from .remote import RemoteTensorDictReplayBuffer
from .sharded import ShardedReplayBuffer
from .transport import DistributedBufferClient

__version__ = "0.6.5"

__all__ = [
    "BufferActorDiedError",
    "BufferNotFoundError",
    "BufferStartError",
    "BufferStateLostError",
    "DistributedBufferClient",
    "RayReplayBuffer",
    "RemoteBufferError",
    "RemoteCallTimeoutError",
    "RemoteTensorDictReplayBuffer",
    "ShardedReplayBuffer",
    "ShardsUnavailableWarning",
]
