"""TileLang's ``tilelang.carver`` as far as its examples reach it: ``carver.arch.driver``
(``driver.get_num_sms()``). The roller config generator (``MatmulTemplate``) is not provided."""
