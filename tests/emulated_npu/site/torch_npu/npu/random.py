"""Emulated torch_npu.npu.random: the RNG state of the emulated cards.

The names and signatures of torch_npu/npu/random.py (Ascend/pytorch: `__all__` = get_rng_state, set_rng_state,
get_rng_state_all, set_rng_state_all, manual_seed, manual_seed_all, seed, seed_all, initial_seed; `device` defaults
to 'npu', the current card). transfer_to_npu installs them as torch.cuda.random.* and, through torch_npu.npu's
`__all__`, as torch.cuda.* (contrib/transfer_to_npu.py). Every emulated card draws from the one CPU generator (the
emulation's tensors are CPU tensors, and `default_generators` maps every card to it: npu/__init__.py), so a card's
state is the CPU generator's state; an index past the emulated cards is refused, as the device raises for it.
"""
import torch

from ..emulation import refuse

__all__ = [
    "get_rng_state",
    "get_rng_state_all",
    "initial_seed",
    "manual_seed",
    "manual_seed_all",
    "seed",
    "seed_all",
    "set_rng_state",
    "set_rng_state_all",
]


def _card(device) -> int:
    """The card a `device` argument names ('npu', 'npu:N', torch.device, an index), checked against the cards."""
    from . import _CURRENT, emulated_cards

    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        # 'cuda' too: Megatron-Core's RNG tracker calls torch.cuda.random.get_rng_state(device="cuda")
        # (tensor_parallel/random.py _get_cuda_rng_state), which transfer_to_npu hands here unchanged, and MindSpeed,
        # which runs that tracker on the device, does not patch it: the device's torch_npu takes it as the current card
        if device.type not in ("npu", "cuda"):
            refuse("npu.random", f"device {device!r} (an npu device)")
        index = device.index if device.index is not None else _CURRENT[0]
    else:
        index = int(device)
    cards = emulated_cards()
    if not cards:
        refuse("npu.random", "the RNG state of a card without emulated cards (PARITY_EMULATED_NPU_CARDS unset)")
    if not 0 <= index < cards:
        refuse("npu.random", f"card {index} of {cards} emulated cards")
    return index


def get_rng_state(device="npu") -> torch.Tensor:
    _card(device)
    return torch.default_generator.get_state()


def set_rng_state(new_state: torch.Tensor, device="npu") -> None:
    _card(device)
    torch.default_generator.set_state(new_state)


def get_rng_state_all():
    from . import emulated_cards

    return [get_rng_state(index) for index in range(emulated_cards())]


def set_rng_state_all(new_states) -> None:
    for index, state in enumerate(new_states):
        set_rng_state(state, index)


def manual_seed(seed) -> None:
    """The emulated device generator IS the CPU generator."""
    torch.default_generator.manual_seed(int(seed))


def manual_seed_all(seed) -> None:
    manual_seed(seed)


def seed() -> None:
    torch.default_generator.seed()


def seed_all() -> None:
    seed()


def initial_seed() -> int:
    return torch.default_generator.initial_seed()
