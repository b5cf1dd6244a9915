import pytest

from platoon.compat.deprecation import renamed_keywords


@renamed_keywords(timeout="timeout_s")
def wait(*, timeout_s=None):
    return timeout_s


def test_an_old_keyword_still_works_with_a_warning_naming_the_new_one():
    with pytest.warns(DeprecationWarning, match=r"wait\(timeout=...\) is deprecated: call it "
                                                r"with timeout_s="):
        assert wait(timeout=3) == 3
    assert wait(timeout_s=4) == 4
    with pytest.raises(TypeError, match="got both timeout_s= and its old name timeout="):
        wait(timeout=1, timeout_s=2)
