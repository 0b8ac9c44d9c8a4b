import time
from tests.cli.helpers import bare_fixture, target_fixture, on  # noqa: F401

def test_show(target):
    t = target
    t.completed("a:1", result={"x": 1}, fingerprint="a"*64)
    t.claim("b:live")
    t.claim("b:stale", lease=0.3)
    t.failed("c:1", error="bad thing")
    time.sleep(0.6)
    for args in (["inspect", "a:1"], ["inspect", "b:stale"], ["inspect", "c:1"], ["list"], ["stats"], ["doctor"], ["unlock", "--stale", "--dry-run"], ["purge", "--dry-run"], ["list", "--limit", "2"]):
        r = on(t.url, *args)
        print(t.name, args, r.exit_code, "\nOUT:", r.stdout, "\nERR:", r.stderr)
