"""python3-capsolver, unchanged, with its own host (https://api.capsolver.com) and only
HTTPS_PROXY set (it turns certificate checks off itself). `solve`: an image task, a
reCAPTCHA v2 task and a balance read; `unsolvable`: an image task the service cannot
solve. Prints one JSON line each. Run by tests/real_json_clients.rs."""

import base64
import json
import os
import sys

from python3_capsolver.control import Control
from python3_capsolver.core.enum import CaptchaTypeEnm
from python3_capsolver.image_to_text import ImageToText
from python3_capsolver.recaptcha import ReCaptcha

key = os.environ["CALLER_KEY"]
mode, image = sys.argv[1], sys.argv[2]
with open(image, "rb") as f:
    body = base64.b64encode(f.read()).decode("ascii")


def out(**line):
    print(json.dumps(line), flush=True)


# Short polling so the test takes seconds, not the library's default 5 s per poll.
image_solver = ImageToText(api_key=key, sleep_time=1)
if mode == "solve":
    answer = image_solver.captcha_handler(task_payload={"body": body, "module": "common"})
    out(kind="image", code=(answer.get("solution") or {}).get("text"), answer=answer)
    recaptcha = ReCaptcha(
        api_key=key, captcha_type=CaptchaTypeEnm.ReCaptchaV2TaskProxyLess, sleep_time=1
    )
    answer = recaptcha.captcha_handler(
        task_payload={
            "websiteURL": "https://example.com/login",
            "websiteKey": "6Le-wvkSAAAAAPBMRTvw0Q4Muexq9bi0DJwx_mJ-",
        }
    )
    out(kind="token", code=(answer.get("solution") or {}).get("gRecaptchaResponse"), answer=answer)
    out(kind="balance", balance=Control(api_key=key).get_balance().get("balance"))
else:
    answer = image_solver.captcha_handler(task_payload={"body": body})
    out(kind="error", code=answer.get("errorCode"), status=str(answer.get("status")), answer=answer)
