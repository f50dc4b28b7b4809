"""Shipments: each class and shared object crosses to a receiver once (no Ray cluster)."""

from __future__ import annotations

import asyncio
import pickle
import sys
import types

import pytest
from ray import cloudpickle

from rollout_ray._ray.wire import MissingShipment, ShipmentPacker, ShipmentUnpacker, deliver


def _module_defined_by_value() -> types.ModuleType:
    """A module workers could not import, as a taskset file loaded by path is."""
    module = types.ModuleType("shipment_taskset")
    exec(
        "from pydantic import BaseModel\n"
        "class Row(BaseModel):\n"
        "    answer: int\n"
        "class Harness:\n"
        "    def __init__(self):\n"
        "        self.calls = 0\n",
        module.__dict__,
    )
    sys.modules[module.__name__] = module
    cloudpickle.register_pickle_by_value(module)
    return module


@pytest.fixture
def taskset():
    module = _module_defined_by_value()
    yield module
    cloudpickle.unregister_pickle_by_value(module)
    del sys.modules[module.__name__]


def test_a_class_body_is_sent_once_and_rows_refer_to_it(taskset) -> None:
    packer, unpacker = ShipmentPacker(), ShipmentUnpacker()
    first_blob, keys = packer.pack(taskset.Row(answer=1))
    first_bodies = packer.bodies(keys)
    assert len(first_bodies) == 1  # the class, by value
    second_blob, keys2 = packer.pack(taskset.Row(answer=2))
    assert keys2 == keys and packer.bodies(keys2) == {}
    # The row alone is small: no class definition inside.
    assert len(second_blob) < len(pickle.dumps(first_bodies)) / 4
    one = unpacker.unpack(first_blob, first_bodies)
    two = unpacker.unpack(second_blob, {})
    assert (one.answer, two.answer) == (1, 2)
    assert type(one) is type(two)  # one class on the receiver, built once


def test_shared_objects_arrive_once_and_stay_one_object(taskset) -> None:
    packer, unpacker = ShipmentPacker(), ShipmentUnpacker()
    harness = taskset.Harness()
    received = []
    for answer in range(3):
        blob, keys = packer.pack({"h": harness, "row": taskset.Row(answer=answer)}, shared=(harness,))
        received.append(unpacker.unpack(blob, packer.bodies(keys)))
    assert received[0]["h"] is received[2]["h"]
    assert [r["row"].answer for r in received] == [0, 1, 2]


def test_a_receiver_without_a_body_says_which_key() -> None:
    packer = ShipmentPacker()
    blob, keys = packer.pack(ShipmentPacker)  # any class is shipped by key
    packer.bodies(keys)
    with pytest.raises(MissingShipment) as missing:
        ShipmentUnpacker().unpack(blob, {})
    assert {missing.value.key} == keys


def test_deliver_resends_every_body_when_the_receiver_lost_them(taskset) -> None:
    packer = ShipmentPacker()
    unpackers = [ShipmentUnpacker()]
    attempts: list[int] = []

    async def send(blob: bytes, bodies: dict[str, bytes]) -> int:
        attempts.append(len(bodies))
        return unpackers[-1].unpack(blob, bodies).answer

    async def main() -> list[int]:
        got = [await deliver(packer, taskset.Row(answer=1), send)]
        unpackers.append(ShipmentUnpacker())  # the receiver was replaced and knows nothing
        got.append(await deliver(packer, taskset.Row(answer=2), send))
        return got

    assert asyncio.run(main()) == [1, 2]
    assert attempts == [1, 0, 1]  # sent, not resent, resent after MissingShipment


def test_keys_are_content_hashes_shared_by_every_sender(taskset) -> None:
    a, b = ShipmentPacker(), ShipmentPacker()
    assert a.key_of(taskset.Row) == b.key_of(taskset.Row)
    assert a.key_of(taskset.Row) != a.key_of(taskset.Harness)


def test_a_new_shared_object_per_message_costs_no_memory_that_grows() -> None:
    """Budgets built per spec: each is shipped, none is held once it is old."""
    from rollout_ray._core.limits import RolloutLimits

    packer, unpacker = ShipmentPacker(), ShipmentUnpacker()
    count = ShipmentPacker.REMEMBERED + 500
    for turns in range(1, count + 1):
        limits = RolloutLimits(max_turns=turns)
        blob, keys = packer.pack({"limits": limits}, shared=(limits,))
        assert unpacker.unpack(blob, packer.bodies(keys)) == {"limits": limits}
    assert len(packer._bodies) == len(packer._by_key) == len(unpacker) == ShipmentPacker.REMEMBERED


def test_a_receiver_that_forgot_a_body_is_sent_it_again() -> None:
    """The unpacker keeps the most recently used bodies; one it forgot is asked for again."""
    from rollout_ray._core.limits import RolloutLimits

    packer, unpacker = ShipmentPacker(), ShipmentUnpacker(remembered=2)
    first = RolloutLimits(max_turns=1)
    calls: list[bool] = []

    async def send(blob: bytes, bodies: dict[str, bytes]) -> object:
        calls.append(bool(bodies))
        return unpacker.unpack(blob, bodies)

    async def main() -> None:
        assert await deliver(packer, first, send, shared=(first,)) == first
        for turns in (2, 3):  # push ``first`` out of the unpacker (the packer still has it)
            other = RolloutLimits(max_turns=turns)
            await deliver(packer, other, send, shared=(other,))
        calls.clear()
        assert await deliver(packer, first, send, shared=(first,)) == first

    asyncio.run(main())
    assert calls == [False, True]  # refused without the body, then sent with it


def test_a_receiver_that_lacks_a_body_it_was_just_sent_is_an_infrastructure_loss(taskset) -> None:
    """The resend carried every body and the receiver still lacks one: it was replaced again
    (or lost what it was sent) under the message. The rollout is re-run (``InfrastructureLost``),
    not failed with ``MissingShipment``, an internal error of the shipping that names no cause."""
    from rollout_ray._errors import InfrastructureLost

    packer = ShipmentPacker()
    sent: list[int] = []

    async def send(blob: bytes, bodies: dict[str, bytes]) -> object:
        sent.append(len(bodies))
        return ShipmentUnpacker(remembered=0).unpack(blob, bodies)  # a receiver that keeps nothing

    with pytest.raises(InfrastructureLost, match="lacks a body it was just sent"):
        asyncio.run(deliver(packer, taskset.Row(answer=1), send))
    assert sent == [1, 1]  # sent, then sent again with every body: not a third time
