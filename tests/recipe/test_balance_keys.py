"""training.balance's keys: refused in one line where a strategy or the shares cannot honour them."""
import pytest

from suite.common.errors import SuiteError
from tests.parity import BASE, make_recipe

TRAINING = BASE["training"]


@pytest.mark.parametrize("strategy, world, training, named", [
    ({"name": "fsdp"}, 2, {"balance": "speed"}, "training.balance=speed gives ranks unequal parts of the batch, which strategy fsdp cannot"),
    ({"name": "hogwild"}, 2, {"balance": "speed"}, "set training.balance=equal, or use ddp, allreduce"),
    ({"name": "ddp"}, 2, {"balance": "shares", "balance_shares": [24, 9]}, "summing to training.batch_size=32"),
    ({"name": "ddp"}, 2, {"balance": "shares"}, "training.balance_shares=[] must give each of the 2"),
    ({"name": "ddp"}, 2, {"balance": "shares", "balance_shares": [31, 1], "grad_accumulation": 2}, "at least training.grad_accumulation=2"),
    ({"name": "ddp"}, 2, {"balance_shares": [16, 16]}, "training.balance_shares is set but training.balance=equal"),
])
def test_balance_errors_name_the_key(strategy, world, training, named):
    with pytest.raises(SuiteError, match="training.balance") as e:
        make_recipe(strategy, world_size=world, training={**TRAINING, **training})
    assert named in str(e.value) and "\n" not in str(e.value)


def test_balance_keys_leave_the_fingerprint_of_an_equal_split_alone():
    plain = make_recipe({"name": "ddp"}, world_size=2)
    assert make_recipe({"name": "ddp"}, world_size=2, training={**TRAINING, "balance": "equal"}).fingerprint() == plain.fingerprint()
