"""ISO 639 language codes the corpus accepts as languages.

* every ISO 639-1 code (two letters, 184 codes);
* every ISO 639-2 code, terminological and bibliographic forms (``deu`` and
  ``ger``), except the special codes ``mis``, ``mul``, ``und``, ``zxx`` and
  the local-use range ``qaa``-``qtz``;
* :data:`LOCALISATION_EXTRAS`: ISO 639-3 individual languages that are not
  in ISO 639-2 but have gettext catalogs in Debian or on PyPI (``ckb``
  Central Kurdish, ``szl`` Silesian, ...).

Other ISO 639-3 codes are not accepted on purpose: most of the ~7,900 are
never used by translation teams, and a directory or file named ``gui`` or
``src`` would otherwise become a language. Add a code to
:data:`LOCALISATION_EXTRAS` when a real catalog needs it.

The lists were generated from the ISO 639-2 registry as shipped by Debian's
``iso-codes`` package (``/usr/share/iso-codes/json/iso_639-2.json``).
"""

from __future__ import annotations

ISO_639_1 = frozenset("""
    aa ab ae af ak am an ar as av ay az ba be bg bh bi bm bn bo br bs ca
    ce ch co cr cs cu cv cy da de dv dz ee el en eo es et eu fa ff fi fj
    fo fr fy ga gd gl gn gu gv ha he hi ho hr ht hu hy hz ia id ie ig ii
    ik io is it iu ja jv ka kg ki kj kk kl km kn ko kr ks ku kv kw ky la
    lb lg li ln lo lt lu lv mg mh mi mk ml mn mr ms mt my na nb nd ne ng
    nl nn no nr nv ny oc oj om or os pa pi pl ps pt qu rm rn ro ru rw sa
    sc sd se sg si sk sl sm sn so sq sr ss st su sv sw ta te tg th ti tk
    tl tn to tr ts tt tw ty ug uk ur uz ve vi vo wa wo xh yi yo za zh zu
""".split())

ISO_639_2 = frozenset("""
    aar abk ace ach ada ady afa afh afr ain aka akk alb ale alg alt amh
    ang anp apa ara arc arg arm arn arp art arw asm ast ath aus ava ave
    awa aym aze bad bai bak bal bam ban baq bas bat bej bel bem ben ber
    bho bih bik bin bis bla bnt bod bos bra bre btk bua bug bul bur byn
    cad cai car cat cau ceb cel ces cha chb che chg chi chk chm chn cho
    chp chr chu chv chy cmc cnr cop cor cos cpe cpf cpp cre crh crp csb
    cus cym cze dak dan dar day del den deu dgr din div doi dra dsb dua
    dum dut dyu dzo efi egy eka ell elx eng enm epo est eus ewe ewo fan
    fao fas fat fij fil fin fiu fon fra fre frm fro frr frs fry ful fur
    gaa gay gba gem geo ger gez gil gla gle glg glv gmh goh gon gor got
    grb grc gre grn gsw guj gwi hai hat hau haw heb her hil him hin hit
    hmn hmo hrv hsb hun hup hye iba ibo ice ido iii ijo iku ile ilo ina
    inc ind ine inh ipk ira iro isl ita jav jbo jpn jpr jrb kaa kab kac
    kal kam kan kar kas kat kau kaw kaz kbd kha khi khm kho kik kin kir
    kmb kok kom kon kor kos kpe krc krl kro kru kua kum kur kut lad lah
    lam lao lat lav lez lim lin lit lol loz ltz lua lub lug lui lun luo
    lus mac mad mag mah mai mak mal man mao map mar mas may mdf mdr men
    mga mic min mkd mkh mlg mlt mnc mni mno moh mon mos mri msa mun mus
    mwl mwr mya myn myv nah nai nap nau nav nbl nde ndo nds nep new nia
    nic niu nld nno nob nog non nor nqo nso nub nwc nya nym nyn nyo nzi
    oci oji ori orm osa oss ota oto paa pag pal pam pan pap pau peo per
    phi phn pli pol pon por pra pro pus que raj rap rar roa roh rom ron
    rum run rup rus sad sag sah sai sal sam san sas sat scn sco sel sem
    sga sgn shn sid sin sio sit sla slk slo slv sma sme smi smj smn smo
    sms sna snd snk sog som son sot spa sqi srd srn srp srr ssa ssw suk
    sun sus sux swa swe syc syr tah tai tam tat tel tem ter tet tgk tgl
    tha tib tig tir tiv tkl tlh tli tmh tog ton tpi tsi tsn tso tuk tum
    tup tur tut tvl twi tyv udm uga uig ukr umb urd uzb vai ven vie vol
    vot wak wal war was wel wen wln wol xal xho yao yap yid yor ypk zap
    zbl zen zgh zha zho znd zul zun zza
""".split())

LOCALISATION_EXTRAS = frozenset("""
    ckb szl brx ltg vec pms lij frp ksh mhr sgs hne yue kmr sdh ary arz
    bar mjw gbm aii tok
    gug nan vls cgg ars lzh mrh skr tzm cmn cak gos shs zam
""".split())  # 2nd line: locale directories of the packaged recipe's catalogs

# Three-letter code -> its ISO 639-1 code, where one exists (``deu`` and
# ``ger`` -> ``de``): the corpus names a language by its shortest code.
TO_ISO_639_1 = dict(pair.split(":") for pair in """
    aar:aa abk:ab afr:af aka:ak alb:sq amh:am ara:ar arg:an arm:hy asm:as
    ava:av ave:ae aym:ay aze:az bak:ba bam:bm baq:eu bel:be ben:bn bih:bh
    bis:bi bod:bo bos:bs bre:br bul:bg bur:my cat:ca ces:cs cha:ch che:ce
    chi:zh chu:cu chv:cv cor:kw cos:co cre:cr cym:cy cze:cs dan:da deu:de
    div:dv dut:nl dzo:dz ell:el eng:en epo:eo est:et eus:eu ewe:ee fao:fo
    fas:fa fij:fj fin:fi fra:fr fre:fr fry:fy ful:ff geo:ka ger:de gla:gd
    gle:ga glg:gl glv:gv gre:el grn:gn guj:gu hat:ht hau:ha heb:he her:hz
    hin:hi hmo:ho hrv:hr hun:hu hye:hy ibo:ig ice:is ido:io iii:ii iku:iu
    ile:ie ina:ia ind:id ipk:ik isl:is ita:it jav:jv jpn:ja kal:kl kan:kn
    kas:ks kat:ka kau:kr kaz:kk khm:km kik:ki kin:rw kir:ky kom:kv kon:kg
    kor:ko kua:kj kur:ku lao:lo lat:la lav:lv lim:li lin:ln lit:lt ltz:lb
    lub:lu lug:lg mac:mk mah:mh mal:ml mao:mi mar:mr may:ms mkd:mk mlg:mg
    mlt:mt mon:mn mri:mi msa:ms mya:my nau:na nav:nv nbl:nr nde:nd ndo:ng
    nep:ne nld:nl nno:nn nob:nb nor:no nya:ny oci:oc oji:oj ori:or orm:om
    oss:os pan:pa per:fa pli:pi pol:pl por:pt pus:ps que:qu roh:rm ron:ro
    rum:ro run:rn rus:ru sag:sg san:sa sin:si slk:sk slo:sk slv:sl sme:se
    smo:sm sna:sn snd:sd som:so sot:st spa:es sqi:sq srd:sc srp:sr ssw:ss
    sun:su swa:sw swe:sv tah:ty tam:ta tat:tt tel:te tgk:tg tgl:tl tha:th
    tib:bo tir:ti ton:to tsn:tn tso:ts tuk:tk tur:tr twi:tw uig:ug ukr:uk
    urd:ur uzb:uz ven:ve vie:vi vol:vo wel:cy wln:wa wol:wo xho:xh yid:yi
    yor:yo zha:za zho:zh zul:zu
""".split())

CODES = ISO_639_1 | ISO_639_2 | LOCALISATION_EXTRAS


# ISO 639-3 codes catalogs use for what the corpus calls by the
# macrolanguage's code (Mandarin catalogs are Chinese: ``cmn_TW`` ->
# ``zh_Hant``).
TO_MACROLANGUAGE = {"cmn": "zh"}


def shortest_code(code: str) -> str:
  """The ISO 639-1 form of a three-letter code that has one (or of its
  macrolanguage, :data:`TO_MACROLANGUAGE`), else ``code``."""
  code = TO_MACROLANGUAGE.get(code, code)
  return TO_ISO_639_1.get(code, code)


def is_language_code(code: str) -> bool:
  """Whether ``code`` (lower case, no region) is an accepted ISO 639 code."""
  return code in CODES
