"""capmonstercloudclient, unchanged, with its own host (https://api.capmonster.cloud). Its
aiohttp ignores HTTPS_PROXY, so keyrelay is given through the client's own proxy option
(KEYRELAY_PROXY_PORT; the caller token, if any, as the proxy password); SSL_CERT_FILE
trusts keyrelay's CA. `solve`: an image task, a reCAPTCHA v2 task and a balance read;
`unsolvable`: an image task the service cannot solve. Prints one JSON line each. Run by
tests/real_json_clients.rs."""

import asyncio
import json
import os
import sys

from capmonstercloudclient import CapMonsterClient, ClientOptions
from capmonstercloudclient.requests import ClientProxyInfo, ImageToTextRequest, RecaptchaV2Request

key = os.environ["CALLER_KEY"]
mode, image = sys.argv[1], sys.argv[2]
proxy = ClientProxyInfo(
    proxyType="http",
    proxyAddress="127.0.0.1",
    proxyPort=int(os.environ["KEYRELAY_PROXY_PORT"]),
    # The client builds its proxy URL only with both set; keyrelay reads the password as
    # the caller token where tokens are configured, and ignores it elsewhere.
    proxyLogin="keyrelay",
    proxyPassword=os.environ.get("KEYRELAY_PROXY_TOKEN") or "none",
)
client = CapMonsterClient(options=ClientOptions(api_key=key, client_proxy=proxy))
with open(image, "rb") as f:
    image_bytes = f.read()


def out(**line):
    print(json.dumps(line), flush=True)


async def main():
    if mode == "solve":
        solution = await client.solve_captcha(ImageToTextRequest(image_bytes=image_bytes))
        out(kind="image", code=solution.get("text"), solution=solution)
        solution = await client.solve_captcha(
            RecaptchaV2Request(
                websiteUrl="https://example.com/login",
                websiteKey="6Le-wvkSAAAAAPBMRTvw0Q4Muexq9bi0DJwx_mJ-",
            )
        )
        out(kind="token", code=solution.get("gRecaptchaResponse"), solution=solution)
        out(kind="balance", balance=await client.get_balance())
    else:
        try:
            await client.solve_captcha(ImageToTextRequest(image_bytes=image_bytes))
            out(kind="error", code=None)
        except Exception as error:  # the client raises on the service's errors
            out(kind="error", code=str(error), type=type(error).__name__)


asyncio.run(main())
