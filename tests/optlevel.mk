# Opt levels: the locale test (tests/test_optlevel.c) needs a locale whose
# decimal point is ','; generate de_DE.UTF-8 when missing (skips otherwise).
ci-deps::
	@if locale -a 2>/dev/null | grep -qiE '^de_DE\.utf-?8$$'; then :; \
	elif command -v localedef >/dev/null 2>&1 && [ -e /usr/share/i18n/locales/de_DE ]; then \
	  localedef -i de_DE -f UTF-8 de_DE.UTF-8 || echo "optlevel: could not generate de_DE.UTF-8 (locale test will skip)"; \
	elif command -v apt-get >/dev/null 2>&1; then \
	  export DEBIAN_FRONTEND=noninteractive; apt-get update -qq && apt-get install -y -qq locales >/dev/null && \
	  localedef -i de_DE -f UTF-8 de_DE.UTF-8 || echo "optlevel: could not generate de_DE.UTF-8 (locale test will skip)"; \
	else echo "optlevel: no localedef/apt-get; the locale test will skip"; fi
