"""Locale subtags besides the language: scripts, regions, variants.

A gettext locale or BCP 47 tag is ``language[_Script][_REGION][_variant]``
(plus a gettext ``@modifier``, handled in :mod:`m4moe.data.languages`).
:func:`m4moe.data.languages.normalize_language` validates every subtag
against these tables, so a directory named ``fr_link`` is not the language
``fr`` in a script called "Link":

* :data:`ISO_15924`: four-letter script codes, title case, without the
  private-use range ``Qaaa``-``Qabx``;
* :data:`REGIONS`: ISO 3166-1 alpha-2 codes, the other two-letter region
  subtags of the IANA registry (withdrawn ones still found in old locales,
  e.g. ``CS``, ``YU``; and ``EU``, ``IC``, ...) without the private-use
  ones (``AA``, ``QM``-``QZ``, ``XA``-``XZ``, ``ZZ``), and the UN M.49
  area codes BCP 47 allows (``419`` Latin America, ``001`` world, ...);
* :data:`VARIANTS`: the registered BCP 47 variant subtags (``valencia``,
  ``1996``, ``tarask``, ...), lower case.

Generated from Debian's ``iso-codes`` package (``iso_15924.json``,
``iso_3166-1.json``, as :mod:`m4moe.data.iso639`) and the IANA Language
Subtag Registry (the version whose File-Date is 6 August 2021). The tables
are kept here, not taken from a library, so that the package needs no
dependency for them.
"""

from __future__ import annotations

ISO_15924 = frozenset("""
    Adlm Afak Aghb Ahom Arab Aran Armi Armn Avst Bali Bamu Bass Batk
    Beng Bhks Blis Bopo Brah Brai Bugi Buhd Cakm Cans Cari Cham Cher
    Chrs Cirt Copt Cpmn Cprt Cyrl Cyrs Deva Diak Dogr Dsrt Dupl Egyd
    Egyh Egyp Elba Elym Ethi Geok Geor Glag Gong Gonm Goth Gran Grek
    Gujr Guru Hanb Hang Hani Hano Hans Hant Hatr Hebr Hira Hluw Hmng
    Hmnp Hrkt Hung Inds Ital Jamo Java Jpan Jurc Kali Kana Khar Khmr
    Khoj Kitl Kits Knda Kore Kpel Kthi Lana Laoo Latf Latg Latn Leke
    Lepc Limb Lina Linb Lisu Loma Lyci Lydi Mahj Maka Mand Mani Marc
    Maya Medf Mend Merc Mero Mlym Modi Mong Moon Mroo Mtei Mult Mymr
    Nand Narb Nbat Newa Nkdb Nkgb Nkoo Nshu Ogam Olck Orkh Orya Osge
    Osma Ougr Palm Pauc Pcun Pelm Perm Phag Phli Phlp Phlv Phnx Piqd
    Plrd Prti Psin Ranj Rjng Rohg Roro Runr Samr Sara Sarb Saur Sgnw
    Shaw Shrd Shui Sidd Sind Sinh Sogd Sogo Sora Soyo Sund Sylo Syrc
    Syre Syrj Syrn Tagb Takr Tale Talu Taml Tang Tavt Telu Teng Tfng
    Tglg Thaa Thai Tibt Tirh Tnsa Toto Ugar Vaii Visp Vith Wara Wcho
    Wole Xpeo Xsux Yezi Yiii Zanb Zinh Zmth Zsye Zsym Zxxx Zyyy Zzzz
""".split())

REGIONS = frozenset("""
    AC AD AE AF AG AI AL AM AN AO AQ AR AS AT AU AW AX AZ BA BB BD BE BF
    BG BH BI BJ BL BM BN BO BQ BR BS BT BU BV BW BY BZ CA CC CD CF CG CH
    CI CK CL CM CN CO CP CR CS CU CV CW CX CY CZ DD DE DG DJ DK DM DO DZ
    EA EC EE EG EH ER ES ET EU EZ FI FJ FK FM FO FR FX GA GB GD GE GF GG
    GH GI GL GM GN GP GQ GR GS GT GU GW GY HK HM HN HR HT HU IC ID IE IL
    IM IN IO IQ IR IS IT JE JM JO JP KE KG KH KI KM KN KP KR KW KY KZ LA
    LB LC LI LK LR LS LT LU LV LY MA MC MD ME MF MG MH MK ML MM MN MO MP
    MQ MR MS MT MU MV MW MX MY MZ NA NC NE NF NG NI NL NO NP NR NT NU NZ
    OM PA PE PF PG PH PK PL PM PN PR PS PT PW PY QA RE RO RS RU RW SA SB
    SC SD SE SG SH SI SJ SK SL SM SN SO SR SS ST SU SV SX SY SZ TA TC TD
    TF TG TH TJ TK TL TM TN TO TP TR TT TV TW TZ UA UG UM UN US UY UZ VA
    VC VE VG VI VN VU WF WS YD YE YT YU ZA ZM ZR ZW
""".split())

UN_M49 = frozenset("""
    001 002 003 005 009 011 013 014 015 017 018 019 021 029 030 034 035
    039 053 054 057 061 142 143 145 150 151 154 155 202 419
""".split())

VARIANTS = frozenset("""
    1606nict 1694acad 1901 1959acad 1994 1996 abl1943 akuapem alalc97
    aluku ao1990 aranes arevela arevmda arkaika asante auvern baku1926
    balanka barla basiceng bauddha biscayan biske bohoric boont bornholm
    cisaup colb1945 cornu creiss dajnko ekavsk emodeng fonipa fonkirsh
    fonnapa fonupa fonxsamp gallo gascon grclass grital grmistr hepburn
    heploc hognorsk hsistemo ijekavsk itihasa ivanchov jauer jyutping
    kkcor kociewie kscor laukika lemosin lengadoc lipaw luna1918 metelko
    monoton ndyuka nedis newfound nicard njiva nulik osojs oxendict
    pahawh2 pahawh3 pahawh4 pamaka peano petr1708 pinyin polyton provenc
    puter rigik rozaj rumgr scotland scouse simple solba sotav spanglis
    surmiran sursilv sutsilv synnejyl tarask tongyong tunumiit uccor
    ucrcor ulster unifon vaidika valencia vallader vecdruka vivaraup
    wadegile xsistemo
""".split())


def is_script(subtag: str) -> bool:
  """Whether ``subtag`` (any case) is an ISO 15924 script code."""
  return subtag.title() in ISO_15924


def is_region(subtag: str) -> bool:
  """Whether ``subtag`` (any case) is a region: ISO 3166-1 alpha-2 or
  another registered two-letter region, or a UN M.49 area code."""
  return subtag.upper() in REGIONS or subtag in UN_M49


def is_variant(subtag: str) -> bool:
  """Whether ``subtag`` (any case) is a registered BCP 47 variant."""
  return subtag.lower() in VARIANTS
