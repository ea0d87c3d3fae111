"""Hostile webhook URLs, pure rules: control characters and whitespace anywhere,
IPv6 forms that reach IPv4 or internal hosts, other spellings of IPv4 addresses,
trailing dots; and the URL as the audit log shows it (no secrets)."""

import pytest

from apps.webhooks import rules

# Every kind of character a URL must not carry raw: C0 controls (CR, LF, tab, NUL,
# vertical tab, form feed, escape), DEL, C1, spaces of every width, line and
# paragraph separators, zero-width and bidi format characters, a byte-order mark.
BAD_CHARACTERS = ["\r", "\n", "\r\n", "\t", "\x00", "\x0b", "\x0c", "\x1b", "\x7f", "\x85",
                  " ", "\u00a0", "\u2002", "\u3000", "\u2028", "\u2029", "\u200b",
                  "\u202e", "\ufeff"]
# Where it sits: before the URL, in the scheme's neighbourhood, the host, the port,
# the path, the query, the end (urlsplit silently drops some of these).
PLACES = ["{c}https://hooks.example.com/x", "https://hooks.exa{c}mple.com/x",
          "https://hooks.example.com:80{c}/x", "https://hooks.example.com/x{c}y",
          "https://hooks.example.com/x?a={c}", "https://hooks.example.com/x{c}",
          "https://hooks.example.com/x{c}Host: evil"]


@pytest.mark.parametrize("char", BAD_CHARACTERS)
@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("allow_private", [False, True])
def test_a_url_with_a_control_character_or_whitespace_is_refused(char, place, allow_private):
    problem = rules.url_problem(place.format(c=char), allow_private=allow_private)
    assert problem is not None and "control characters" in problem


# IPv6 and other forms that reach loopback, private, link-local (metadata) or other
# not-public hosts.
REFUSED_ADDRESSES = [
    "64:ff9b::7f00:1", "64:ff9b::a9fe:a9fe", "64:ff9b::10.0.0.1", "64:ff9b::c0a8:1",  # NAT64
    "64:ff9b:1::808:808", "64:ff9b:1::7f00:1",  # local-use NAT64, whatever it carries
    "2002:7f00:1::", "2002:a9fe:a9fe::1", "2002:0a00:0001::",  # 6to4
    "::ffff:127.0.0.1", "::ffff:169.254.169.254", "::ffff:0:0", "::ffff:10.1.2.3",  # mapped
    "::127.0.0.1", "::10.0.0.1", "::8.8.8.8",  # IPv4-compatible (deprecated: all refused)
    "2001:0:4136:e378:8000:63bf:3fff:fdd2", "2001::1",  # Teredo
    "fe80::1", "fe80::1%eth0", "febf::1", "fec0::1", "fc00::1", "fd12:3456::1",
    "ff02::1", "ff05::1", "ff0e::1", "::", "::1", "100::1", "2001:db8::1",
    "0.0.0.0", "127.0.0.1", "127.255.255.254", "10.0.0.1", "172.31.255.255",
    "192.168.1.1", "169.254.169.254", "100.64.0.1", "224.0.0.1", "239.255.255.250",
    "233.252.0.1", "255.255.255.255", "240.0.0.1", "198.18.0.1", "192.0.0.1",
]
PUBLIC_ADDRESSES = ["93.184.216.34", "8.8.8.8", "2606:4700::1111", "2001:4860:4860::8888",
                    "64:ff9b::808:808", "64:ff9b::5db8:d822",  # NAT64 of a public host
                    "2002:808:808::1", "::ffff:8.8.8.8"]


@pytest.mark.parametrize("address", REFUSED_ADDRESSES)
def test_addresses_that_reach_no_public_host_are_refused(address):
    assert rules.address_refusal(address), address
    literal = f"[{address}]" if ":" in address else address
    literal = literal.replace("%", "%25")
    problem = rules.url_problem(f"https://{literal}/hook", allow_private=False)
    assert problem is not None, address
    assert rules.url_problem(f"https://{literal}./hook", allow_private=False) is not None


@pytest.mark.parametrize("address", PUBLIC_ADDRESSES)
def test_public_addresses_and_the_forms_that_carry_them_are_allowed(address):
    assert rules.address_refusal(address) is None
    literal = f"[{address}]" if ":" in address else address
    assert rules.url_problem(f"https://{literal}/hook", allow_private=False) is None


def test_a_refusal_names_the_ipv4_address_an_ipv6_one_carries():
    assert rules.address_refusal("64:ff9b::a9fe:a9fe") == (
        "NAT64 form of 169.254.169.254, link-local (cloud metadata lives there) address")
    assert "6to4 form of 127.0.0.1" in rules.address_refusal("2002:7f00:1::")


# Other spellings of IPv4 addresses (decimal, octal, hexadecimal, short forms, leading
# zeros): resolvers read them as addresses, so none is a name. Refused even where
# private addresses are allowed: nobody means them.
@pytest.mark.parametrize("host", ["2130706433", "0x7f.1", "017700000001", "0x7f000001",
                                  "0177.0.0.1", "127.1", "127.0.1", "127.0.0.01",
                                  "0x7f.0x0.0x0.0x1", "0", "0x", "1.2.3.4.5",
                                  "256.0.0.1", "example.123", "2130706433.",
                                  "4294967296", "0xA9FEA9FE"])
@pytest.mark.parametrize("allow_private", [False, True])
def test_other_spellings_of_ipv4_addresses_are_refused(host, allow_private):
    problem = rules.url_problem(f"http://{host}/hook", allow_private=allow_private)
    assert problem is not None and "IPv4" in problem
    with pytest.raises(ValueError):
        rules.host_address(host)


@pytest.mark.parametrize("url", ["http://localhost/x", "http://localhost./x",
                                 "http://LOCALHOST./x", "http://a.localhost./x",
                                 "http://127.0.0.1./x", "http://[::1]./x",
                                 "http://[::ffff:7f00:1]/x", "http://[0:0:0:0:0:ffff:127.0.0.1]/x",
                                 "http://[fe80::1%25eth0]/x"])
def test_loopback_written_with_a_trailing_dot_or_another_form_is_refused(url):
    assert rules.url_problem(url, allow_private=False) is not None


@pytest.mark.parametrize("url", ["http://127.0.0.1:8080/hook", "http://localhost/hook",
                                 "http://[::1]:9/hook", "http://10.0.0.5/hook"])
def test_the_setting_still_allows_loopback_and_private_addresses(url):
    assert rules.url_problem(url, allow_private=True) is None
    assert rules.url_problem(url, allow_private=False) is not None


@pytest.mark.parametrize("url", ["http://ex%61mple.com/", "http://exa_mple-.com/",
                                 "http://a..b/", "http://-a.com/", f"http://{'a' * 64}.com/",
                                 f"http://{'a.' * 127}com/", "http://[v1.x]/",
                                 "http://[::1/", "http://x.com:0/", "http://x.com:65536/",
                                 "http://@x.com/", "http://u@x.com/", "http://:p@x.com/",
                                 "http://x.com:-1/", "javascript://x.com/%0aalert(1)"])
def test_malformed_hosts_ports_and_credentials_are_refused(url):
    assert rules.url_problem(url, allow_private=True) is not None


@pytest.mark.parametrize("host", ["hooks.example.com", "hooks.example.com.", "a-b.c_d.io",
                                  "xn--bcher-kva.example", "1a.example.com", "x.y.0z"])
def test_ordinary_names_pass_the_rules(host):
    assert rules.host_address(host) is None
    assert rules.url_problem(f"https://{host}/hook?x=1", allow_private=False) is None


@pytest.mark.parametrize("url, shown", [
    ("https://hooks.slack.com/services/T0/B0/sEcReT", "https://hooks.slack.com/…"),
    ("https://user:sEcReT@x.example.com:8443/a?token=sEcReT#sEcReT",
     "https://x.example.com:8443/…"),
    ("https://x.example.com/?key=sEcReT", "https://x.example.com/…"),
    ("http://[::1]:9/", "http://[::1]:9/"),
    ("https://x.example.com", "https://x.example.com/"),
    ("http://x.com:99999/sEcReT", "(a URL that does not parse)"),
    ("not a url sEcReT", "(a URL that does not parse)"),
    ("http://exa\r\nmple.com/sEcReT", "(a URL that does not parse)"),
])
def test_the_url_shown_beyond_the_owners_holds_no_path_query_or_credentials(url, shown):
    assert rules.url_shown(url) == shown
